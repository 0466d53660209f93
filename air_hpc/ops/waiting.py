"""Follow a submitted job to its end, within a deadline: a job that outlives it is an error, never a hang.

The deadline for ``--wait`` is the longest a run may legitimately take
(:func:`wait_deadline_s`); when it passes, the job keeps running and the error
says how to follow or stop it.
"""

import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from air_hpc.config.models import JobConfig
from air_hpc.errors import AirHpcError, ConfigError, TrainingFailed, WaitTimeoutError
from air_hpc.ownership.local_job import local_job_status
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import submissions
from air_hpc.slurm.client import SlurmClient
from air_hpc.slurm.jobs import JobState, JobStatus

T = TypeVar("T")

#: Time a job may spend in the queue (before its first start, and between requeues) on top of its run time.
QUEUE_ALLOWANCE_S = 3600.0


def wait_deadline_s(job: JobConfig) -> float:
    """The longest a run may take: every start its restart budget allows at the full time limit, plus the queue."""
    return (job.resilience.max_restarts + 1) * job.resources.time_limit_min * 60.0 + QUEUE_ALLOWANCE_S


#: The deadline of a watched run whose job is not recorded (no readable job.json).
UNRECORDED_JOB_DEADLINE_S = 24 * 3600.0


def run_deadline_s(run_dir: RunDir) -> float:
    """The wait deadline of the job the run recorded in job.json (a day when none is readable)."""
    try:
        return wait_deadline_s(run_dir.read_job())
    except (AirHpcError, OSError):
        return UNRECORDED_JOB_DEADLINE_S


def poll_until(
    poll: Callable[[], T], done: Callable[[T], bool], *, timeout_s: float, poll_s: float, what: Callable[[T], str]
) -> Iterator[T]:
    """Yield each polled value until one is ``done`` (yielded too); :class:`WaitTimeoutError` once ``timeout_s`` passes.

    ``what`` describes the last value for the error ("job 12 is RUNNING").
    """
    deadline_s = time.monotonic() + timeout_s
    while True:
        value = poll()
        yield value
        if done(value):
            return
        remaining_s = deadline_s - time.monotonic()
        if remaining_s <= 0:
            raise WaitTimeoutError(f"{what(value)} after the {timeout_s:g} s wait deadline; it keeps running")
        time.sleep(min(poll_s, remaining_s))


def wait_slurm(
    client: SlurmClient,
    job_id: str,
    *,
    timeout_s: float,
    poll_s: float = 2.0,
    on_change: Callable[[JobStatus], None] | None = None,
) -> JobStatus:
    """Poll until the job reaches a final state (a requeued job goes back to PENDING and keeps going)."""
    last: JobStatus | None = None
    for status in poll_until(
        lambda: client.job_status(job_id),
        lambda found: found is not None and found.state.terminal,
        timeout_s=timeout_s,
        poll_s=poll_s,
        what=lambda found: f"job {job_id} is {found.state if found else 'not known to Slurm yet'}",
    ):
        if status is None:
            continue
        if on_change is not None and (last is None or (status.state, status.restarts) != (last.state, last.restarts)):
            on_change(status)
        last = status
    assert last is not None  # poll_until ends only on a final state
    return last


def wait_local(run_dir: RunDir, job_id: str, *, timeout_s: float, poll_s: float = 1.0) -> JobStatus:
    """Block until a LocalExecutor job ends; raise if it did not complete.

    Its state comes from the run's records (see :mod:`air_hpc.ownership.local_job`),
    never from submitit's result pickles.
    """

    def poll() -> JobStatus:
        record = next((r for r in submissions(run_dir) if r.job_id == job_id), None)
        if record is None:
            raise ConfigError(f"--wait: {run_dir.submissions} has no record of local job {job_id}")
        return local_job_status(run_dir, record)

    status = None
    for found in poll_until(
        poll,
        lambda found: found.state is not JobState.RUNNING,
        timeout_s=timeout_s,
        poll_s=poll_s,
        what=lambda found: f"local job {job_id} is {found.state}",
    ):
        status = found
    assert status is not None  # poll_until yields at least once
    if not status.state.succeeded:
        raise TrainingFailed(
            f"local job {job_id} failed ({status.state}: {status.reason}); logs: {run_dir.path}/submitit"
        )
    return status


def describe_failure(status: JobStatus) -> str:
    code = f", exit code {status.exit_code}" if status.exit_code is not None else ""
    return f"job {status.job_id} ended {status.state}{code} after {status.restarts} restart(s)"
