"""Polling until something happens, for tests that watch real processes, files and Slurm."""

import time
from collections.abc import Callable

from air_hpc.slurm.client import SlurmClient
from air_hpc.slurm.jobs import JobStatus


def wait_for(what: str, condition: Callable[..., object], timeout_s: float, poll_s: float = 0.05) -> None:
    """Return once ``condition()`` is true; fail the test naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll_s)


def wait_ended(client: SlurmClient, job_id: str, timeout_s: float, poll_s: float = 0.5) -> JobStatus:
    """Poll the controller until the job is in a final state (a requeue keeps it going); returns that status."""
    deadline = time.monotonic() + timeout_s
    status = client.job_status(job_id)
    while status is None or not status.state.terminal:
        assert time.monotonic() < deadline, f"job {job_id} did not end in {timeout_s:g} s: {status}"
        time.sleep(poll_s)
        status = client.job_status(job_id)
    return status
