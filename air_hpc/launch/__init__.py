"""Getting a run onto the machines: submission and the per-rank entry point."""
