"""Submission: plan the nodes and the batch script, claim the run, hand the job to an executor."""
