"""Start a run's TrainingEntry on this machine through submitit's LocalExecutor, without Slurm."""

import os
from typing import Any

import submitit

from air_hpc.config.models import JobConfig
from air_hpc.records.rundir import RunDir
from air_hpc.runtime.entry import TrainingEntry


def submit_local(job: JobConfig, timeout_min: int) -> tuple[RunDir, Any]:
    """Record ``job`` in its run directory and start its ranks; returns the run and submitit's job.

    One thread per rank (OMP_NUM_THREADS=1): the CI machine has two cores for four ranks.
    """
    run_dir = RunDir.of(job)
    run_dir.write_job(job)
    os.environ["OMP_NUM_THREADS"] = "1"
    executor = submitit.LocalExecutor(folder=job.run.root / "submitit" / job.run.name)
    executor.update_parameters(tasks_per_node=job.resources.tasks_per_node, nodes=1, timeout_min=timeout_min)
    return run_dir, executor.submit(TrainingEntry(run_dir.path))
