import os
import time
from pathlib import Path

import pytest

from air_hpc.config import load_job
from air_hpc.exitcodes import ExitCode
from air_hpc.health.guard import KEEP_GENERATIONS, prune_generations, rank_guard, record_verdict
from air_hpc.health.heartbeat import read_beats
from air_hpc.health.preflight import SharedStorageError, UnhealthyNodeError
from air_hpc.records.events import read_events
from air_hpc.records.generation import read_exit_code
from air_hpc.records.rundir import RunDir
from air_hpc.train import data

REPO = Path(__file__).parent.parent.parent
ENV = {"SLURM_JOB_ID": "9", "SLURM_RESTART_COUNT": "1"}


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    text = tmp_path / "text.txt"
    text.write_text("hello world\n" * 50)
    return data.prepare([text], tmp_path / "corpus.h5", data.ByteTokenizer()).path


def test_guard_checks_beats_and_finishes_done(tmp_path: Path, corpus: Path) -> None:
    job = load_job(REPO / "configs" / "jobs" / "gpt-tiny-local.yaml", [f"run.root={tmp_path}", f"data.path={corpus}"])
    run_dir = RunDir.of(job)
    with rank_guard(job, run_dir, 0, 4, "n1", ENV) as heartbeat:
        heartbeat.beat("step", 1)
        assert read_beats(run_dir.heartbeat / "9-1")[0].phase == "step"
    assert read_beats(run_dir.heartbeat / "9-1")[0].phase == "done"
    (start,) = read_events(run_dir.events)
    assert (start["kind"], start["generation"], start["world_size"], start["host"]) == ("start", "9-1", 4, "n1")
    record_verdict(run_dir, ENV, ExitCode.REQUEUE)
    assert read_exit_code(run_dir.heartbeat / "9-1") == ExitCode.REQUEUE


def test_unreadable_data_everywhere_blames_no_node(tmp_path: Path) -> None:
    broken = tmp_path / "broken.h5"
    broken.write_bytes(b"not hdf5")
    job = load_job(REPO / "configs" / "jobs" / "gpt-tiny-local.yaml", [f"run.root={tmp_path}", f"data.path={broken}"])
    run_dir = RunDir.of(job)
    with (
        pytest.raises(SharedStorageError, match=r"node n2 failed pre-flight: data: .*the shared storage is at fault"),
        rank_guard(job, run_dir, 1, 4, "n2", ENV, peer_wait_s=0.3),
    ):
        pytest.fail("training must not start")
    assert not run_dir.bad_nodes.exists()
    assert read_exit_code(run_dir.heartbeat / "9-1") == ExitCode.FAILURE


def test_unreadable_data_on_one_node_blames_it(tmp_path: Path, corpus: Path) -> None:
    broken = tmp_path / "broken.h5"
    broken.write_bytes(b"not hdf5")
    good = load_job(REPO / "configs" / "jobs" / "gpt-tiny-local.yaml", [f"run.root={tmp_path}", f"data.path={corpus}"])
    run_dir = RunDir.of(good)
    with rank_guard(good, run_dir, 0, 4, "n1", ENV):
        pass
    # Same run, but this node sees a stale mount (here: another file) while n1 read it fine.
    stale = good.model_copy(update={"data": good.data.model_copy(update={"path": broken})})
    with (
        pytest.raises(UnhealthyNodeError, match="node n2 failed pre-flight: data: "),
        rank_guard(stale, run_dir, 2, 4, "n2", ENV, peer_wait_s=5),
    ):
        pytest.fail("training must not start on an unhealthy node")
    assert run_dir.bad_nodes.read_text().startswith("n2  # unhealthy: node n2 failed pre-flight: data:")
    assert read_exit_code(run_dir.heartbeat / "9-1") == ExitCode.UNHEALTHY


def test_old_generations_are_pruned(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path)
    for n in range(6):
        path = run_dir.heartbeat / f"9-{n}"
        path.mkdir(parents=True)
        os.utime(path, (time.time() - 100 + n, time.time() - 100 + n))
    prune_generations(run_dir, keep="9-0")
    kept = sorted(p.name for p in run_dir.heartbeat.iterdir())
    assert kept == ["9-0", "9-4", "9-5"] and len(kept) == KEEP_GENERATIONS


def test_step_limit_must_be_shorter_than_the_collective_timeout() -> None:
    from air_hpc.errors import ConfigError

    job_file = REPO / "configs" / "jobs" / "gpt-tiny-local.yaml"
    with pytest.raises(ConfigError, match=r"health\.heartbeat_step_s: 600 s is not shorter than train\.dist_timeout_s"):
        load_job(job_file, ["health.heartbeat_step_s=600"])
    assert load_job(job_file, ["health.heartbeat_step_s=600", "health.watchdog=false"]).health.heartbeat_step_s == 600
