"""Following a job ends within a deadline: a job that outlives it is one clear error, never a hang (fake controller)."""

import ast
import os
import time
from pathlib import Path

import psutil
import pytest

import air_hpc.topology.request
from air_hpc.config import load_job
from air_hpc.errors import WaitTimeoutError
from air_hpc.ops.waiting import run_deadline_s, wait_deadline_s, wait_local, wait_slurm
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import record_submission
from air_hpc.slurm.fake import FakeSlurm
from air_hpc.slurm.jobs import JobState, JobStatus

REPO = Path(__file__).resolve().parents[2]
TESTBED_JOB = REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml"


def queued(fake: FakeSlurm, tmp_path: Path) -> str:
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --nodes=1\ntrue\n")
    return fake.sbatch(script)


def test_a_job_that_outlives_the_deadline_is_one_error_naming_it(tmp_path: Path) -> None:
    fake = FakeSlurm()
    job_id = queued(fake, tmp_path)
    started = time.monotonic()
    with pytest.raises(WaitTimeoutError, match=rf"job {job_id} is PENDING after the 0.3 s wait deadline; it keeps"):
        wait_slurm(fake, job_id, timeout_s=0.3, poll_s=0.05)
    assert 0.3 <= time.monotonic() - started < 5.0


def test_a_job_that_ends_in_time_returns_its_final_state_and_reports_each_change(tmp_path: Path) -> None:
    fake = FakeSlurm()
    job_id = queued(fake, tmp_path)
    seen: list[JobStatus] = []

    def on_change(status: JobStatus) -> None:
        seen.append(status)
        if status.state is JobState.PENDING and status.restarts == 0:
            fake.start(job_id, "n1")
        elif status.state is JobState.RUNNING:
            fake.finish(job_id)

    final = wait_slurm(fake, job_id, timeout_s=30, poll_s=0.01, on_change=on_change)
    assert final.state is JobState.COMPLETED
    assert [s.state for s in seen] == [JobState.PENDING, JobState.RUNNING, JobState.COMPLETED]


def test_a_local_job_that_outlives_the_deadline_is_one_error(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path / "run")
    me = str(os.getpid())  # this process stands in for a controller that never ends
    record_submission(run_dir, me, "local", pid_started_s=psutil.Process().create_time())
    with pytest.raises(WaitTimeoutError, match=rf"local job {me} is RUNNING after the 0.2 s wait deadline"):
        wait_local(run_dir, me, timeout_s=0.2, poll_s=0.05)


def test_the_deadline_covers_every_start_the_restart_budget_allows(tmp_path: Path) -> None:
    job = load_job(
        TESTBED_JOB,
        [f"run.root={tmp_path}", "resources.time_limit_min=10", "resilience.max_restarts=2"],
    )
    assert wait_deadline_s(job) == 3 * 10 * 60 + 3600
    run_dir = RunDir.of(job)
    assert run_deadline_s(run_dir) == 24 * 3600, "no job.json: a day"
    run_dir.write_job(job)
    assert run_deadline_s(run_dir) == wait_deadline_s(job)


def test_node_request_orchestration_never_runs_slurm() -> None:
    """topology/request.py is handed the live node state; it imports nothing that could ask Slurm for it."""
    tree = ast.parse(Path(air_hpc.topology.request.__file__).read_text())
    imported = {
        f"{node.module}.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    # Slurm's hostlist syntax (text in, text out) and what each release accepts (a version in, rules out)
    pure = ("air_hpc.slurm.hostlist", "air_hpc.slurm.version")
    runs_slurm = (
        "air_hpc.slurm",
        "air_hpc.launch",
        "air_hpc.runtime",
        "air_hpc.ownership",
        "air_hpc.ops",
        "subprocess",
    )
    assert not {name for name in imported if name.startswith(runs_slurm) and not name.startswith(pure)}
