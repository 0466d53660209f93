"""Local-executor runs are followed through JSON records and a proven process: no pickle, no bare PID."""

import contextlib
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from air_hpc.ops.control import cancel_run, run_status
from air_hpc.ownership.local_job import ProcessIdentity, ignores
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import record_exit, record_submission
from air_hpc.resilience.store import CheckpointStore
from air_hpc.slurm.fake import FakeSlurm
from air_hpc.slurm.jobs import JobState
from tests.conftest import RunMain
from tests.unit.test_observe_report import preempted_run
from tests.unit.test_resilience_store import save


class Plant:
    """Unpickling this creates ``marker``: proof that something read the pickle."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, ...]]:
        return (os.system, (f"touch {self.marker}",))


def ended_pid() -> ProcessIdentity:
    """The PID and start time of a process that has already exited."""
    proc = subprocess.Popen(["sleep", "0.2"])
    identity = ProcessIdentity.of(proc.pid)
    proc.wait()
    return identity


@pytest.fixture
def unrelated() -> Iterator[psutil.Process]:
    """A real process that has nothing to do with any run (it ignores nothing: SIGINT would end it)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield psutil.Process(proc.pid)
    proc.kill()
    proc.wait()


def local_run(tmp_path: Path, pid: int, started_s: float | None) -> RunDir:
    run_dir = preempted_run(tmp_path / "runs")
    record_submission(run_dir, str(pid), "local", pid_started_s=started_s)
    return run_dir


def test_no_cli_command_unpickles_what_a_run_directory_holds(tmp_path: Path, run_main: RunMain) -> None:
    identity = ended_pid()
    run_dir = local_run(tmp_path, identity.pid, identity.started_s)
    record_exit(run_dir, str(identity.pid), 0, 0)
    marker = tmp_path / "unpickled"
    folder = run_dir.path / "submitit"
    folder.mkdir()
    for name in ("_0_result.pkl", "_1_result.pkl", "_submitted.pkl"):
        (folder / f"{identity.pid}{name}").write_bytes(pickle.dumps(Plant(marker)))
    store = CheckpointStore(run_dir.checkpoints, keep_last=5)
    step_dir = save(store, 5)
    (step_dir / ".metadata").write_bytes(pickle.dumps(Plant(marker)))
    (step_dir / "common.pt").write_bytes(pickle.dumps(Plant(marker)))
    run = str(run_dir.path)
    commands = [
        ["status", run],
        ["status", run, "--json"],
        ["logs", run],
        ["logs", run, "--rank", "1"],
        ["report", run],
        ["report", run, "--json"],
        ["plot", run, "-o", str(tmp_path / "run.png")],
        ["ckpt", "list", run],
        ["ckpt", "list", run, "--deep"],
        ["ckpt", "verify", run],
        ["runs", "--root", str(tmp_path / "runs")],
        ["cancel", run],
    ]
    for args in commands:
        run_main(args)
        assert not marker.exists(), f"`air-hpc {' '.join(args)}` unpickled a planted pickle"


def test_status_comes_from_the_ranks_exit_records(tmp_path: Path) -> None:
    identity = ended_pid()
    run_dir = local_run(tmp_path, identity.pid, identity.started_s)
    job_id = str(identity.pid)
    status = run_status(run_dir, FakeSlurm()).job
    assert status.state is JobState.FAILED and "without any rank recording" in status.reason
    record_exit(run_dir, job_id, 0, 0)
    status = run_status(run_dir, FakeSlurm()).job
    assert status.state is JobState.FAILED and "rank(s) 1, 2, 3 recorded no exit code" in status.reason
    for rank in (1, 2, 3):
        record_exit(run_dir, job_id, rank, 85)
    assert run_status(run_dir, FakeSlurm()).job.exit_code == 85, "requeued start"
    for rank in (1, 2, 3):
        record_exit(run_dir, job_id, rank, 0)
    status = run_status(run_dir, FakeSlurm()).job
    assert (status.state, status.exit_code) == (JobState.COMPLETED, 0), "the last start of each rank counts"
    record_exit(run_dir, job_id, 2, 1)
    status = run_status(run_dir, FakeSlurm()).job
    assert (status.state, status.exit_code, status.reason) == (JobState.FAILED, 1, "rank 2 exited 1")


def test_malformed_records_are_data_not_crashes(tmp_path: Path) -> None:
    identity = ended_pid()
    run_dir = local_run(tmp_path, identity.pid, identity.started_s)
    with run_dir.submissions.open("a") as out:
        for row in (
            {"event": "ended", "job_id": str(identity.pid), "rank": "x", "exit_code": 0},
            {"event": "ended", "job_id": str(identity.pid), "rank": 0, "exit_code": [1]},
            {"event": "submitted", "job_id": "²", "executor": "local", "time": "soon", "pid_started_s": "x"},
        ):
            out.write(json.dumps(row) + "\n")
    status = run_status(run_dir, FakeSlurm()).job
    assert status.state is JobState.UNKNOWN and "cannot tell" in status.reason


def test_a_reused_pid_is_neither_running_nor_signalled(
    tmp_path: Path, unrelated: psutil.Process, run_main: RunMain
) -> None:
    run_dir = local_run(tmp_path, unrelated.pid, unrelated.create_time() - 100.0)
    assert run_status(run_dir, FakeSlurm()).job.state is JobState.FAILED
    code, out, _ = run_main(["cancel", str(run_dir.path)])
    time.sleep(0.3)
    assert unrelated.is_running() and unrelated.status() != psutil.STATUS_ZOMBIE, "an unrelated process was signalled"
    assert code == 0 and "already ended" in out


def test_a_pid_without_start_time_is_never_signalled(
    tmp_path: Path, unrelated: psutil.Process, run_main: RunMain
) -> None:
    run_dir = preempted_run(tmp_path / "runs")
    with run_dir.submissions.open("a") as out:
        out.write(json.dumps({"event": "submitted", "job_id": str(unrelated.pid), "executor": "local"}) + "\n")
    assert run_status(run_dir, FakeSlurm()).job.state is JobState.UNKNOWN
    code, _, err = run_main(["cancel", str(run_dir.path)])
    time.sleep(0.3)
    assert unrelated.is_running() and unrelated.status() != psutil.STATUS_ZOMBIE
    assert code == 2 and err.count("\n") == 1 and "cannot be proven" in err


@pytest.mark.parametrize(
    ("sigint", "ended_by"),
    [(signal.SIG_DFL, {-signal.SIGINT, 1}), (signal.SIG_IGN, {-signal.SIGTERM})],
    ids=["sigint-default", "sigint-ignored"],
)
def test_the_proven_controller_is_running_then_cancelled(
    tmp_path: Path, sigint: signal.Handlers, ended_by: set[int]
) -> None:
    """SIGINT stops the controller; one started where SIGINT is ignored (nohup, a script's ``&``) gets SIGTERM."""
    code = "import time; open('ready', 'w').close(); time.sleep(60)"
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=tmp_path, preexec_fn=lambda: signal.signal(signal.SIGINT, sigint)
    )
    try:
        wait_for_file(tmp_path / "ready")
        assert ignores(proc.pid, signal.SIGINT) is (sigint == signal.SIG_IGN)
        run_dir = local_run(tmp_path, proc.pid, ProcessIdentity.of(proc.pid).started_s)
        assert run_status(run_dir, FakeSlurm()).job.state is JobState.RUNNING
        cancel_run(run_dir, FakeSlurm())
        assert proc.wait(timeout=10) in ended_by
        assert run_status(run_dir, FakeSlurm()).job.state is JobState.CANCELLED
    finally:
        proc.kill()
        proc.wait()


#: A controller whose task ignores SIGINT and SIGTERM (a rank still in submitit's bootstrap): the controller
#: dies on SIGINT and leaves the task behind.
STUBBORN_TASK = """
import signal, subprocess, sys, time
task = (
    "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "open('task-ready', 'w').close(); time.sleep(600)"
)
proc = subprocess.Popen([sys.executable, "-c", task])
open("task.pid", "w").write(str(proc.pid))
time.sleep(600)
"""


def test_cancel_kills_what_ignores_the_stop_and_says_what_it_ended(tmp_path: Path) -> None:
    controller = subprocess.Popen([sys.executable, "-c", STUBBORN_TASK], cwd=tmp_path)
    task: psutil.Process | None = None
    try:
        wait_for_file(tmp_path / "task-ready")
        task = psutil.Process(int((tmp_path / "task.pid").read_text()))
        run_dir = local_run(tmp_path, controller.pid, ProcessIdentity.of(controller.pid).started_s)
        outcome = cancel_run(run_dir, FakeSlurm())
        assert outcome.cancelled and outcome.state == "RUNNING"
        assert outcome.detail == "1 process(es) stopped, 1 killed after ignoring the stop for 10 s"
        assert controller.wait(timeout=10) in (1, -signal.SIGINT)
        assert not task.is_running() or task.status() == psutil.STATUS_ZOMBIE
        assert run_status(run_dir, FakeSlurm()).job.state is JobState.CANCELLED
        again = cancel_run(run_dir, FakeSlurm())
        assert (again.cancelled, again.state) == (False, "CANCELLED")
    finally:
        for proc in (controller, task):
            with contextlib.suppress(psutil.Error, ProcessLookupError, AttributeError):
                proc.kill()  # type: ignore[union-attr]
        controller.wait()


def wait_for_file(path: Path, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)
