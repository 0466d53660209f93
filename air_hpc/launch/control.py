"""Job control on a run: its state, its log files, cancelling it.

A run is followed through its latest submission: Slurm jobs (our script or
submitit's) through the Slurm client, local jobs through the submitit
controller's process and result files.
"""

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from air_hpc.errors import UserError
from air_hpc.health.badnodes import read_bad_nodes
from air_hpc.launch.runs import SubmissionRecord, latest_submission
from air_hpc.observe.progress import RunProgress, run_progress
from air_hpc.observe.records import load_records
from air_hpc.render.spec import batch_log_paths
from air_hpc.rundir import RunDir
from air_hpc.slurm.client import SlurmClient
from air_hpc.slurm.jobs import JobState, JobStatus


@dataclass(frozen=True)
class RunStatus:
    run_dir: RunDir
    submission: SubmissionRecord
    job: JobStatus
    progress: RunProgress | None
    bad_nodes: tuple[str, ...]

    @property
    def restarts(self) -> int:
        """The larger of Slurm's count and the starts the batch script recorded (either may lag)."""
        return max(self.job.restarts, self.submission.starts - 1)

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.run_dir.path),
            "executor": self.submission.executor,
            **self.job.to_json(),
            "restarts": self.restarts,
            "progress": self.progress.to_json() if self.progress else None,
            "bad_nodes": list(self.bad_nodes),
        }


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def local_job_status(run_dir: RunDir, record: SubmissionRecord) -> JobStatus:
    """A LocalExecutor job: running while its controller lives; then its result files tell."""
    import submitit

    def status(state: JobState, reason: str = "") -> JobStatus:
        return JobStatus(record.job_id, state, 1, "localhost", run_dir.path.name, 0, "local", reason)

    if record.job_id.isdigit() and _pid_alive(int(record.job_id)):
        return status(JobState.RUNNING)
    job: submitit.LocalJob[Any] = submitit.LocalJob(folder=run_dir.path / "submitit", job_id=record.job_id)
    if not job.paths.result_pickle.exists():
        return status(JobState.FAILED, "the local controller exited without a result")
    try:
        job.result()
    except Exception as exc:  # submitit re-raises the task's failure
        return status(JobState.FAILED, (str(exc).strip().splitlines() or ["failed"])[-1])
    return status(JobState.COMPLETED)


def run_status(run_dir: RunDir, client: SlurmClient) -> RunStatus:
    record = latest_submission(run_dir)
    if record.executor == "local":
        job = local_job_status(run_dir, record)
    else:
        found = client.job_status(record.job_id)
        if found is None:
            raise UserError(f"job {record.job_id} of run {run_dir.path}: neither squeue nor sacct knows it")
        job = found
    progress = run_progress(load_records(run_dir), time.time())
    return RunStatus(run_dir, record, job, progress, read_bad_nodes(run_dir.bad_nodes))


def log_files(run_dir: RunDir, record: SubmissionRecord, rank: int | None = None) -> list[Path]:
    """The files holding a run's output (existing or not yet written), most useful first.

    ``rank``: the rank's own log when the trainer wrote one, else the
    executor's per-task output.
    """
    if rank is not None and run_dir.rank_log(rank).exists():
        return [run_dir.rank_log(rank)]
    if record.executor == "slurm":
        return list(batch_log_paths(run_dir.path, record.job_id))
    folder = run_dir.path / "submitit"
    task = rank if rank is not None else 0
    return [folder / f"{record.job_id}_{task}_log.out", folder / f"{record.job_id}_{task}_log.err"]


def rank_filter(record: SubmissionRecord, rank: int | None) -> str | None:
    """Line prefix that selects one rank from ``srun --label`` output (our script's batch log)."""
    if rank is None or record.executor != "slurm":
        return None
    return f"{rank}: "


def cancel_run(run_dir: RunDir, client: SlurmClient) -> SubmissionRecord:
    record = latest_submission(run_dir)
    if record.executor == "local":
        if record.job_id.isdigit() and _pid_alive(int(record.job_id)):
            # submitit's LocalJob.cancel: SIGINT to the controller, which stops its tasks.
            os.kill(int(record.job_id), signal.SIGINT)
    else:
        client.scancel(record.job_id)
    return record
