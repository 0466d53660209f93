"""gpt-tiny trains for real on 4 CPU ranks through submitit's LocalExecutor (gloo, Megatron-core).

Lean on purpose (2 cores): a few steps per run, OMP_NUM_THREADS=1 per rank.
"""

import os
from pathlib import Path
from typing import Any

import pytest
import submitit

from air_hpc.config.load import load_job
from air_hpc.launch.entry import TrainingEntry
from air_hpc.rundir import RunDir
from air_hpc.train import data
from air_hpc.train.metrics import read_metrics

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
STEPS = 6


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's own README and sources, the same corpus the demo trains on."""
    sources = [REPO / "README.md", *sorted((REPO / "air_hpc").rglob("*.py"))]
    out = tmp_path_factory.mktemp("data") / "corpus.h5"
    data.prepare(sources, out, data.ByteTokenizer())
    return out


def train(tmp_path: Path, corpus: Path, name: str, *overrides: str) -> tuple[RunDir, list[Any]]:
    job = load_job(
        REPO / "configs/jobs/gpt-tiny-local.yaml",
        [f"run.name={name}", f"run.root={tmp_path}", f"data.path={corpus}", f"train.steps={STEPS}", *overrides],
    )
    run_dir = RunDir.of(job)
    run_dir.write_job(job)
    os.environ["OMP_NUM_THREADS"] = "1"
    executor = submitit.LocalExecutor(folder=tmp_path / "submitit" / name)
    executor.update_parameters(tasks_per_node=job.resources.tasks_per_node, nodes=1, timeout_min=5)
    results = executor.submit(TrainingEntry(run_dir.path)).results()
    return run_dir, results


def losses(run_dir: RunDir) -> list[float]:
    records = read_metrics(run_dir.metrics)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert all({"loss", "lr", "grad_norm", "tokens_per_s", "step_time_s"} <= r.keys() for r in records)
    return [r["loss"] for r in records]


def assert_learning(values: list[float]) -> None:
    assert values[-1] < values[0] - 0.3, values
    assert max(values[2:]) < values[0], values


def test_tp2_pp2_learns_and_two_runs_are_bitwise_identical(tmp_path: Path, corpus: Path) -> None:
    first, results = train(tmp_path, corpus, "a")
    second, _ = train(tmp_path, corpus, "b")
    assert len(results) == 4 and all(r.last_step == STEPS for r in results)
    assert_learning(losses(first))
    assert losses(first) == losses(second)
    logs = sorted(p.name for p in first.logs.iterdir())
    assert logs == [f"rank-{r}.log" for r in range(4)]
    for rank in range(4):
        lines = first.rank_log(rank).read_text().splitlines()
        assert lines and all(f"rank={rank} " in line for line in lines)


def test_tp2_dp2_learns(tmp_path: Path, corpus: Path) -> None:
    run_dir, _ = train(tmp_path, corpus, "dp", "parallel.pp=1")
    assert_learning(losses(run_dir))


def test_virtual_stages_give_the_same_step_with_and_without_tp(tmp_path: Path, corpus: Path) -> None:
    """TP slices the same full weights (CPU init), so TP2 and TP1xDP2 must agree to float tolerance."""
    tp2, _ = train(tmp_path, corpus, "vpp-tp2", "parallel.vpp=2", "train.steps=3")
    tp1, _ = train(tmp_path, corpus, "vpp-tp1", "parallel.vpp=2", "parallel.tp=1", "train.steps=3")
    a, b = read_metrics(tp2.metrics), read_metrics(tp1.metrics)
    assert len(a) == len(b) == 3
    for x, y in zip(a, b, strict=True):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-5)
        assert x["grad_norm"] == pytest.approx(y["grad_norm"], rel=1e-4)
