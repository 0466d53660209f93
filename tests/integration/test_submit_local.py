"""The local executor (submitit's LocalExecutor): real worker processes, run records, status, wait."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from air_hpc.config import load_job
from air_hpc.errors import TrainingFailed
from air_hpc.launch.submit import submit
from air_hpc.ops.control import run_status
from air_hpc.ops.waiting import wait_local
from air_hpc.records.rundir import RunDir
from air_hpc.slurm.fake import FakeSlurm
from air_hpc.slurm.jobs import JobState
from tests.integration.waiting import wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
LOCAL_JOB = REPO / "configs" / "jobs" / "gpt-tiny-local.yaml"


class Steps:
    """Stands in for TrainingEntry: rank 0 writes two metrics lines, every rank checks its environment."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def __call__(self) -> str:
        import submitit

        rank = submitit.JobEnvironment().global_rank
        assert os.environ["OMP_NUM_THREADS"] == "1"
        assert os.environ["AIR_HPC_PROBE"] == "it's $(not run)"
        if rank == 0:
            lines = [{"step": 1, "loss": 2.5}, {"step": 2, "loss": 2.25}]
            RunDir(self.run_dir).metrics.write_text("".join(json.dumps(x) + "\n" for x in lines))
        return f"rank {rank}"


class Sleeps:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def __call__(self) -> None:
        time.sleep(300)


class Fails:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def __call__(self) -> None:
        raise RuntimeError("boom in the payload")


def local_job(tmp_path: Path, name: str, corpus: Path):
    job = load_job(
        LOCAL_JOB,
        [
            f"run.root={tmp_path}",
            f"run.name={name}",
            f"data.path={corpus}",
            "resources.tasks_per_node=2",
            "parallel.pp=1",
        ],
    )
    return job.model_copy(update={"env": {**job.env, "AIR_HPC_PROBE": "it's $(not run)"}})


def test_local_executor_runs_waits_and_reports(tmp_path: Path, small_corpus: Path) -> None:
    done = submit(local_job(tmp_path, "ok", small_corpus), "local", FakeSlurm(), entry=Steps)
    assert done.handle is not None
    wait_local(RunDir(done.run_dir), done.job_id, timeout_s=120)
    assert sorted(done.handle.results()) == ["rank 0", "rank 1"]
    status = run_status(RunDir(done.run_dir), FakeSlurm())
    assert status.submission.executor == "local" and status.job.state is JobState.COMPLETED
    assert status.progress is not None and (status.progress.step, status.progress.loss) == (2, 2.25)
    assert (done.run_dir / "submitit").is_dir() and RunDir(done.run_dir).job_json.is_file()


def job_processes(run_dir: RunDir) -> list[psutil.Process]:
    """Every process whose command line names the run directory (submitit's controller and ranks)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(str(run_dir.path) in part for part in proc.info["cmdline"] or ()):
            found.append(proc)
    return found


def test_cancel_right_after_submit_ends_every_process_of_the_job(tmp_path: Path, small_corpus: Path) -> None:
    """A cancel while the ranks are still in submitit's bootstrap: nothing of the job is left running."""
    done = submit(local_job(tmp_path, "early-cancel", small_corpus), "local", FakeSlurm(), entry=Sleeps)
    run_dir = RunDir(done.run_dir)
    result = subprocess.run(
        [sys.executable, "-m", "air_hpc", "cancel", str(run_dir.path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and f"cancelled job {done.job_id} (local)" in result.stdout, result.stderr
    assert "process(es) stopped" in result.stdout
    left = [p for p in job_processes(run_dir) if p.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"still running after cancel said it ended the job: {[(p.pid, p.cmdline()) for p in left]}"
    assert run_status(run_dir, FakeSlurm()).job.state is JobState.CANCELLED
    again = subprocess.run(
        [sys.executable, "-m", "air_hpc", "cancel", str(run_dir.path)], capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0 and "had already ended: CANCELLED; nothing to cancel" in again.stdout


def test_local_executor_failure_is_reported(tmp_path: Path, small_corpus: Path) -> None:
    done = submit(local_job(tmp_path, "fails", small_corpus), "local", FakeSlurm(), entry=Fails)
    with pytest.raises(TrainingFailed, match="failed"):
        wait_local(RunDir(done.run_dir), done.job_id, timeout_s=120)
    assert run_status(RunDir(done.run_dir), FakeSlurm()).job.state is JobState.FAILED
    assert "rank 0 exited 1" in run_status(RunDir(done.run_dir), FakeSlurm()).job.reason


def test_cli_cancel_stops_the_controller_and_its_ranks(tmp_path: Path, small_corpus: Path) -> None:
    """The recorded PID is submitit's ``sh -c`` around the controller: cancel must reach the controller itself."""
    done = submit(local_job(tmp_path, "cancelled", small_corpus), "local", FakeSlurm(), entry=Sleeps)
    run_dir = RunDir(done.run_dir)
    shell = psutil.Process(int(done.job_id))
    wait_for("controller and two ranks started", lambda: len(shell.children(recursive=True)) >= 3, 60)
    family = [shell, *shell.children(recursive=True)]
    assert run_status(run_dir, FakeSlurm()).job.state is JobState.RUNNING
    result = subprocess.run(
        [sys.executable, "-m", "air_hpc", "cancel", str(run_dir.path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and f"cancelled job {done.job_id} (local)" in result.stdout, result.stderr
    _, alive = psutil.wait_procs(family, timeout=30)
    assert not alive, f"still running after cancel: {[p.pid for p in alive]}"
    status = run_status(run_dir, FakeSlurm()).job
    assert status.state is JobState.CANCELLED
