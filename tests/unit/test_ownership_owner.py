"""One live owner per run directory (lock at submit, fence at rank start) and complete runs (fake controller)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from air_hpc.cli.main import cli
from air_hpc.config import load_job
from air_hpc.errors import UserError
from air_hpc.exitcodes import ExitCode
from air_hpc.launch.submit import RunComplete, completed_step, submit
from air_hpc.ownership.local_job import ProcessIdentity
from air_hpc.ownership.owner import NotOwnerError, RunBusyError, claim, fence, read_owner
from air_hpc.records.rundir import RunDir
from air_hpc.resilience.store import CheckpointStore
from air_hpc.slurm.fake import FakeSlurm
from air_hpc.slurm.jobs import JobState

REPO = Path(__file__).resolve().parents[2]
TESTBED_JOB = REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml"


@pytest.fixture
def job_args(tmp_path: Path, small_corpus: Path) -> list[str]:
    return [f"run.root={tmp_path / 'runs'}", f"data.path={small_corpus}", "train.steps=6"]


def test_a_second_live_job_on_a_run_directory_is_refused_naming_the_owner(job_args: list[str]) -> None:
    fake = FakeSlurm()
    job = load_job(TESTBED_JOB, job_args)
    first = submit(job, "slurm", fake).job_id
    script = RunDir.of(job).sbatch.read_text()
    with pytest.raises(RunBusyError, match=rf"job {first} \(slurm\) still owns this run directory") as busy:
        submit(load_job(TESTBED_JOB, [*job_args, "train.lr=0.1"]), "slurm", fake)
    assert busy.value.exit_code == ExitCode.USAGE
    assert [c[1] for c in fake.calls if c[0] == "sbatch"].count("--parsable") == 1
    assert RunDir.of(job).sbatch.read_text() == script  # the live job's files are untouched
    fake.requeue(first)  # pending again after a requeue: still the owner
    with pytest.raises(RunBusyError):
        submit(job, "slurm", fake)
    fake.finish(first, JobState.CANCELLED)
    second = submit(job, "slurm", fake).job_id  # a stale claim is taken over
    owner = read_owner(RunDir.of(job))
    assert owner is not None and (owner.job_id, owner.executor) == (second, "slurm")


def test_the_fence_stops_a_rank_of_another_job(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    fence(run, {"SLURM_JOB_ID": "7"})  # never claimed: nothing to enforce
    run.owner.write_text(json.dumps({"job_id": "7", "executor": "slurm", "time_s": 1.0}))
    fence(run, {"SLURM_JOB_ID": "7"})
    fence(run, {"SUBMITIT_LOCAL_JOB_ID": "7", "SLURM_JOB_ID": "99"})
    with pytest.raises(NotOwnerError, match="belongs to job 7, not to this job 8: exiting before writing anything"):
        fence(run, {"SLURM_JOB_ID": "8"})
    assert sorted(p.name for p in run.path.iterdir()) == [".owner.lock", "owner.json"]


def test_an_unreadable_owner_record_names_the_file(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    run.owner.write_text("{not json")
    with pytest.raises(UserError, match=r"owner\.json: unreadable owner record"):
        fence(run, {"SLURM_JOB_ID": "8"})


def test_a_local_owner_is_identified_by_pid_and_start_time(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with claim(run, lambda owner: owner.local_process_alive()) as record:
            owner = record(str(child.pid), "local", ProcessIdentity.of(child.pid))
        assert owner.local_process_alive()
        with pytest.raises(RunBusyError), claim(run, lambda o: o.local_process_alive()):
            pass
        run.owner.write_text(json.dumps({**json.loads(run.owner.read_text()), "pid_start_s": 1.0}))
        recorded = read_owner(run)
        assert recorded is not None and not recorded.local_process_alive()  # same PID, other start: not ours
    finally:
        child.kill()
        child.wait()
    assert os.path.exists(run.owner_lock)


def commit(store: CheckpointStore, step: int) -> None:
    staging = store.begin(step)
    (staging / "common.pt").write_bytes(b"x" * 10)
    store.commit(step)


def test_a_run_with_its_final_checkpoint_is_complete(job_args: list[str]) -> None:
    fake = FakeSlurm()
    job = load_job(TESTBED_JOB, job_args)
    store = CheckpointStore(RunDir.of(job).checkpoints, keep_last=3)
    commit(store, 4)
    assert completed_step(job) is None
    commit(store, 6)
    assert completed_step(job) == 6
    with pytest.raises(RunComplete, match=r"is complete: its final checkpoint \(step 6\) exists for train.steps=6"):
        submit(job, "slurm", fake)
    assert fake.calls == []  # nothing reached Slurm, nothing written
    assert completed_step(load_job(TESTBED_JOB, [*job_args, "train.steps=10"])) is None  # more steps: continue
    assert submit(job, "slurm", fake, force=True).job_id
    (store.path(6) / "common.pt").write_bytes(b"")  # a broken final checkpoint does not make a run complete
    assert completed_step(job) is None


def test_submit_cli_says_a_complete_run_is_complete_and_exits_0(job_args: list[str]) -> None:
    job = load_job(TESTBED_JOB, job_args)
    commit(CheckpointStore(RunDir.of(job).checkpoints, keep_last=3), 6)
    fake = FakeSlurm()
    sets = [arg for pair in (("--set", a) for a in job_args) for arg in pair]
    result = CliRunner().invoke(cli, ["submit", str(TESTBED_JOB), *sets], obj={"slurm_client": fake})
    assert result.exit_code == 0, result.output
    assert "is complete" in result.output and "--force" in result.output and fake.calls == []
    forced = CliRunner().invoke(cli, ["submit", str(TESTBED_JOB), *sets, "--force"], obj={"slurm_client": fake})
    assert forced.exit_code == 0 and forced.output.strip().splitlines()[-1] == "100"
