"""A run's state when Slurm cannot tell: slurmdbd down (say so, ask the queue), or the job forgotten (its records)."""

import json
from pathlib import Path

import pytest

from air_hpc.cli.main import cli
from air_hpc.config import load_job
from air_hpc.errors import AccountingUnreachableError, SlurmUnreachableError, UserError
from air_hpc.ops.control import run_status
from air_hpc.ops.states import snapshot
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import record_submission
from air_hpc.slurm.fake import FakeSlurm
from air_hpc.slurm.jobs import JobState
from tests.unit.test_observe_report import REPO, preempted_run

LOCAL_JOB = REPO / "configs" / "jobs" / "gpt-tiny-local.yaml"


def slurm_run(root: Path, fake: FakeSlurm, name: str, steps: int) -> tuple[RunDir, str]:
    """A run submitted through our script whose records show 10 steps trained of ``steps``."""
    trained = preempted_run(root / "source")  # 10 steps in metrics.jsonl
    job = load_job(LOCAL_JOB, [f"run.root={root}", f"run.name={name}", f"train.steps={steps}"])
    run_dir = RunDir.of(job)
    run_dir.write_job(job)
    run_dir.metrics.write_text(trained.metrics.read_text())
    job_id = fake.sbatch(run_dir.job_json)
    record_submission(run_dir, job_id, "slurm")
    fake.start(job_id, "n1")
    return run_dir, job_id


def test_accounting_down_is_not_a_dead_controller() -> None:
    fake = FakeSlurm(retries=3)
    fake.accounting_up = False
    with pytest.raises(AccountingUnreachableError, match=r"Slurm accounting \(slurmdbd\) unreachable: sacct: error: "):
        fake.sacct(["1"])
    assert len(fake.calls) == 1, "a refused slurmdbd is an answer, not a reason to wait"
    assert fake.squeue() == [], "the controller is not taken for down"


def test_status_with_slurmdbd_down_asks_the_queue_then_the_runs_records(tmp_path: Path) -> None:
    fake = FakeSlurm()
    running, _ = slurm_run(tmp_path, fake, "running", 20)
    done, done_id = slurm_run(tmp_path, fake, "done", 10)
    ended, ended_id = slurm_run(tmp_path, fake, "ended", 20)
    fake.finish(done_id)
    fake.finish(ended_id, JobState.FAILED, 1)
    fake.accounting_up = False
    assert run_status(running, fake).job.state is JobState.RUNNING
    status = run_status(done, fake).job
    assert (status.state, status.source) == (JobState.COMPLETED, "records")
    assert "every step trained" in status.reason and "slurmdbd" in status.reason
    status = run_status(ended, fake).job
    assert (status.state, status.source) == (JobState.UNKNOWN, "squeue")
    assert status.reason.startswith("squeue no longer lists it and Slurm accounting (slurmdbd) unreachable")


def test_runs_with_slurmdbd_down_keeps_the_queues_states(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeSlurm()
    slurm_run(tmp_path, fake, "running", 20)
    _, done_id = slurm_run(tmp_path, fake, "done", 10)
    fake.finish(done_id)
    fake.accounting_up = False
    cli.main(args=["runs", "--root", str(tmp_path), "--json"], standalone_mode=False, obj={"slurm_client": fake})
    states = {r["name"]: r["state"] for r in json.loads(capsys.readouterr().out)["runs"]}
    assert states == {"done": "COMPLETED", "running": "RUNNING"}
    assert {m.summary.name: m.state for m in snapshot(tmp_path, fake)} == {
        "done": JobState.COMPLETED,
        "running": JobState.RUNNING,
    }


def test_a_finished_run_is_complete_by_its_records_once_slurm_forgets_it(tmp_path: Path) -> None:
    fake = FakeSlurm()
    done, done_id = slurm_run(tmp_path, fake, "done", 10)
    partial, partial_id = slurm_run(tmp_path, fake, "partial", 20)
    fake.finish(done_id)
    fake.finish(partial_id)
    del fake.jobs[done_id], fake.jobs[partial_id]  # past MinJobAge and purged from accounting
    assert run_status(done, fake).job.state is JobState.COMPLETED
    with pytest.raises(UserError, match="neither squeue nor sacct knows it, and its records do not show it finished"):
        run_status(partial, fake)
    assert {m.summary.name: m.state for m in snapshot(tmp_path, fake)}["done"] is JobState.COMPLETED
    fake.reachable = False  # the testbed is down
    status = run_status(done, fake).job
    assert (status.state, status.source) == (JobState.COMPLETED, "records")
    with pytest.raises(SlurmUnreachableError):
        run_status(partial, fake)
    assert {m.summary.name: m.state for m in snapshot(tmp_path, fake)} == {
        "done": JobState.COMPLETED,
        "partial": JobState.UNKNOWN,
    }
