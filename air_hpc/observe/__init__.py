"""Watching a run from its files: progress, the goodput report and plots (no Slurm access needed)."""
