"""The client's typed calls and retry rule, against the fake controller (real formats, kept state)."""

from pathlib import Path

import pytest

from air_hpc.errors import SlurmError, SlurmUnreachableError
from air_hpc.slurm.fake import FakeSlurm
from air_hpc.slurm.jobs import JobState

SCRIPT = """#!/bin/bash
#SBATCH --job-name="two words"
#SBATCH --partition=debug
#SBATCH --nodes=2
srun true
#SBATCH --nodes=9
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "job.sbatch"
    path.write_text(SCRIPT)
    return path


def test_submit_then_follow_a_job_through_requeue(script: Path) -> None:
    fake = FakeSlurm()
    job_id = fake.sbatch(script)
    job = fake.jobs[job_id]
    assert (job.name, job.nodes) == ("two words", 2), "directives after the first command are ignored"
    status = fake.job_status(job_id)
    assert status is not None and status.state is JobState.PENDING and status.source == "squeue"
    fake.start(job_id, "n[1-2]")
    fake.scontrol_requeue(job_id)
    fake.start(job_id, "n[3-4]")
    status = fake.job_status(job_id)
    assert status is not None and (status.state, status.restarts, status.nodelist) == (
        JobState.RUNNING,
        1,
        "n[3-4]",
    )
    fake.finish(job_id)
    status = fake.job_status(job_id)
    assert status is not None and (status.state, status.restarts, status.source) == (JobState.COMPLETED, 1, "sacct")


def test_test_only_reports_where_it_would_run(script: Path) -> None:
    fake = FakeSlurm()
    result = fake.sbatch_test_only(script)
    assert result.nodelist == "n[1-2]" and result.partition == "debug"
    assert fake.jobs == {}


def test_unknown_job_is_none_not_an_error() -> None:
    fake = FakeSlurm()
    assert fake.job_status("999") is None
    assert fake.show_job("999") is None
    assert fake.squeue(["999"]) == []


def test_read_only_calls_retry_then_give_one_clear_error() -> None:
    fake = FakeSlurm(retries=2)
    fake.reachable = False
    with pytest.raises(SlurmUnreachableError, match=r"squeue gave no answer within 20 s") as info:
        fake.job_status("1")
    assert "\n" not in str(info.value)
    assert len(fake.calls) == 3


def test_sbatch_is_never_retried(script: Path) -> None:
    fake = FakeSlurm(retries=5)
    fake.reachable = False
    with pytest.raises(SlurmUnreachableError, match="may or may not have been submitted"):
        fake.sbatch(script)
    assert [c[0] for c in fake.calls] == ["sbatch"]


def test_requeue_is_never_retried() -> None:
    fake = FakeSlurm(retries=5)
    fake.reachable = False
    with pytest.raises(SlurmUnreachableError):
        fake.scontrol_requeue("1")
    assert len(fake.calls) == 1


def test_scancel_and_signal(script: Path) -> None:
    fake = FakeSlurm()
    job_id = fake.sbatch(script)
    fake.start(job_id, "n[1-2]")
    fake.scancel(job_id, signal="USR2", batch=True)
    assert fake.jobs[job_id].signals == ["USR2"] and fake.jobs[job_id].state is JobState.RUNNING
    assert ["scancel", "--signal=USR2", "--batch", job_id] in fake.calls
    fake.scancel(job_id)
    assert fake.jobs[job_id].state is JobState.CANCELLED
    with pytest.raises(SlurmError, match="Invalid job id"):
        fake.scancel("424242")


def test_squeue_by_user_lists_only_live_jobs(script: Path) -> None:
    fake = FakeSlurm()
    first, second = fake.sbatch(script), fake.sbatch(script)
    fake.finish(first)
    assert [r.job_id for r in fake.squeue(user="root")] == [second]
