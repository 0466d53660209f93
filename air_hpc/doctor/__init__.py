"""Cluster inspection: what ``air-hpc doctor`` checks against a cluster and a job, and cluster profiles."""
