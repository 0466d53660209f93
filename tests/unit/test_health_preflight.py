import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from air_hpc.config import load_job
from air_hpc.config.models import DataConfig, JobConfig
from air_hpc.exitcodes import ExitCode
from air_hpc.health.badnodes import read_bad_nodes
from air_hpc.health.preflight import (
    UnhealthyNodeError,
    check_checkpoint_dir,
    check_data,
    check_gpus,
    check_ib,
    enforce,
    run_preflight,
)
from air_hpc.records.events import read_events
from air_hpc.records.generation import read_exit_code
from air_hpc.records.rundir import RunDir
from air_hpc.train import data

REPO = Path(__file__).parent.parent.parent
IBSTAT = REPO / "tests" / "data" / "ibstat"
GB = 10**9


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 20)
    out = tmp_path / "corpus.h5"
    data.prepare([text], out, data.ByteTokenizer())
    return out


def job(tmp_path: Path, corpus: Path, *overrides: str) -> JobConfig:
    return load_job(
        REPO / "configs" / "jobs" / "gpt-tiny-local.yaml",
        [f"run.root={tmp_path / 'runs'}", f"data.path={corpus}", *overrides],
    )


def test_gpus_count_and_memory() -> None:
    h100 = 85_520_809_984  # what torch reports for an 80 GB H100
    assert check_gpus([h100] * 8, 8, 80).ok
    missing = check_gpus([h100] * 7, 8, 80)
    assert not missing.ok and missing.detail == "7 visible GPU(s), expected 8"
    small = check_gpus([h100] * 7 + [40 * GB], 8, 80)
    assert not small.ok and small.detail == "GPU 7 has 40.0 GB, expected 80 GB"


def test_ib_ports_of_the_job_must_be_active() -> None:
    text = (IBSTAT / "dgx_h100_mixed.txt").read_text()
    assert check_ib(text, ("mlx5_0", "mlx5_2"), 0).ok
    down = check_ib(text, ("mlx5_0", "mlx5_1", "mlx5_3", "mlx5_7"), 0)
    assert not down.ok
    assert down.detail == "mlx5_7 not present, mlx5_1:1 is Down/Polling, mlx5_3:1 is Initializing/LinkUp"
    slow = check_ib(text, ("mlx5_0", "mlx5_2"), 400)
    assert not slow.ok and slow.detail == "mlx5_2:1 runs at 200 Gb/s, expected 400"
    assert check_ib(None, ("mlx5_0",), 400).ok


def test_checkpoint_dir_writable_and_free(tmp_path: Path) -> None:
    assert check_checkpoint_dir(tmp_path / "ckpt", 0.001).ok
    full = check_checkpoint_dir(tmp_path / "ckpt", 1e12)
    assert not full.ok and "health.min_free_disk_gb is 1e+12" in full.detail


#: Root writes into read-only directories through these capabilities; without them it meets the permission
#: bits like any user (CI runs as root, so the check must be tested there too).
ROOT_OVERRIDES = "-dac_override,-dac_read_search,-fowner"
CHECK_IN_CHILD = (
    "import json, sys; from pathlib import Path; from air_hpc.health.preflight import check_checkpoint_dir; "
    "r = check_checkpoint_dir(Path(sys.argv[1]), 0); print(json.dumps([r.ok, r.detail]))"
)


def checkpoint_dir_check_as_a_plain_user(directory: Path) -> tuple[bool, str]:
    """``check_checkpoint_dir`` in a child that cannot override file permissions, even when we are root."""
    argv = [sys.executable, "-c", CHECK_IN_CHILD, str(directory)]
    if os.geteuid() == 0:
        argv = ["setpriv", "--inh-caps=-all", f"--bounding-set={ROOT_OVERRIDES}", "--", *argv]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=REPO)
    ok, detail = json.loads(done.stdout)
    return ok, detail


def test_read_only_checkpoint_dir_fails(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        ok, detail = checkpoint_dir_check_as_a_plain_user(locked / "ckpt")
    finally:
        locked.chmod(0o700)
    assert (ok, detail) == (False, f"{locked / 'ckpt'} is not writable: Permission denied")
    assert checkpoint_dir_check_as_a_plain_user(tmp_path / "open")[0], "the same child writes where it may"


def test_data_must_be_readable(tmp_path: Path, corpus: Path) -> None:
    assert check_data(DataConfig(path=corpus)).ok
    broken = tmp_path / "broken.h5"
    broken.write_bytes(corpus.read_bytes()[:2048])
    result = check_data(DataConfig(path=broken))
    assert not result.ok and result.detail.startswith(f"{broken}: ")
    assert not check_data(DataConfig(path=tmp_path / "missing.h5")).ok


def test_data_check_finds_a_truncated_shard_of_a_blend(tmp_path: Path, corpus: Path) -> None:
    shards = tmp_path / "shards"
    shards.mkdir()
    for name in ("a.h5", "b.h5", "c.h5"):
        (shards / name).write_bytes(corpus.read_bytes())
    blend = DataConfig(blend=({"path": shards, "weight": 1}, {"path": corpus, "weight": 2}))
    assert check_data(blend).ok and "4 shard(s)" in check_data(blend).detail
    middle = shards / "b.h5"
    middle.write_bytes(corpus.read_bytes()[:-100])
    result = check_data(blend)
    assert not result.ok and result.detail.startswith(f"{middle}: ") and "truncated" in result.detail, result.detail


def test_cpu_job_passes_and_is_only_logged(tmp_path: Path, corpus: Path) -> None:
    cfg = job(tmp_path, corpus)
    report = run_preflight(cfg, "n1", probe_gpus=lambda: pytest.fail("no GPU check on CPU"))
    assert report.ok and [c.name for c in report.checks] == ["checkpoint dir", "data"]
    run_dir = RunDir.of(cfg)
    enforce(report, run_dir, run_dir.heartbeat / "1-0", rank=0)
    assert read_bad_nodes(run_dir.bad_nodes) == ()


def test_failing_node_is_recorded_and_raises_unhealthy(tmp_path: Path, corpus: Path) -> None:
    base = job(tmp_path, corpus, "health.min_ib_rate_gbps=400")
    cfg = base.model_copy(update={"hardware": base.hardware.model_copy(update={"hcas": ("mlx5_0", "mlx5_1")})})
    ibstat = (IBSTAT / "dgx_h100_mixed.txt").read_text()
    report = run_preflight(cfg, "n3", probe_ibstat=lambda: ibstat)
    assert not report.ok
    assert report.summary() == "node n3 failed pre-flight: infiniband: mlx5_1:1 is Down/Polling"
    run_dir = RunDir.of(cfg)
    generation = run_dir.heartbeat / "5-0"
    with pytest.raises(UnhealthyNodeError, match="node n3 failed pre-flight") as caught:
        enforce(report, run_dir, generation, rank=2)
    assert caught.value.exit_code == ExitCode.UNHEALTHY
    assert read_bad_nodes(run_dir.bad_nodes) == ("n3",)
    assert read_exit_code(generation) == ExitCode.UNHEALTHY
    (event,) = read_events(run_dir.events)
    assert event["kind"] == "unhealthy" and event["node"] == "n3"
    assert event["failed"] == {"infiniband": "mlx5_1:1 is Down/Polling"}
    # A second rank on the same node adds neither a line nor an event.
    with pytest.raises(UnhealthyNodeError):
        enforce(report, run_dir, generation, rank=3)
    assert len(run_dir.bad_nodes.read_text().splitlines()) == 1
    assert len(read_events(run_dir.events)) == 1
