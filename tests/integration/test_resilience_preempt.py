"""A TP2xPP2 gpt-tiny run preempted twice through submitit's LocalExecutor ends exactly like an uninterrupted one.

The task processes are signalled (``job._interrupt()`` would only reach submitit's controller).
Each time the ranks agree at a step boundary, save synchronously, requeue, and resume.
"""

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import submitit

from air_hpc.config.load import load_job
from air_hpc.exitcodes import ExitCode
from air_hpc.launch.entry import TrainingEntry
from air_hpc.resilience.events import read_events
from air_hpc.rundir import RunDir
from air_hpc.train import data
from air_hpc.train.metrics import read_metrics

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
STEPS = 7


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data") / "corpus.h5"
    data.prepare(data.project_sources(), out, data.ByteTokenizer())
    return out


def job_overrides(root: Path, corpus: Path, name: str) -> list[str]:
    return [
        f"run.name={name}",
        f"run.root={root}",
        f"data.path={corpus}",
        f"train.steps={STEPS}",
        "checkpoint.interval_steps=3",
        "checkpoint.keep_last=10",
        "health.preflight=false",
    ]


def submit(root: Path, corpus: Path, name: str, config: str = "gpt-tiny-local.yaml", *extra: str) -> tuple[RunDir, Any]:
    """Through submitit's LocalExecutor on this machine."""
    job = load_job(REPO / "configs" / "jobs" / config, [*job_overrides(root, corpus, name), *extra])
    run_dir = RunDir.of(job)
    run_dir.write_job(job)
    os.environ["OMP_NUM_THREADS"] = "1"
    executor = submitit.LocalExecutor(folder=root / "submitit" / name)
    executor.update_parameters(tasks_per_node=job.resources.tasks_per_node, nodes=1, timeout_min=10)
    return run_dir, executor.submit(TrainingEntry(run_dir.path))


def wait_for(what: str, condition: Any, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def last_step(run_dir: RunDir) -> int:
    records = read_metrics(run_dir.metrics) if run_dir.metrics.exists() else []
    return max((r["step"] for r in records), default=0)


def kinds(run_dir: RunDir, kind: str) -> list[dict[str, Any]]:
    return [e for e in read_events(run_dir.events) if e["kind"] == kind]


def signal_tasks(handle: Any, expected: int = 4) -> None:
    """Signal the tasks and every process they started, as slurmstepd does with a step's processes."""
    tasks = psutil.Process(int(handle.job_id)).children()
    assert len(tasks) == expected
    for proc in [*tasks, *(c for t in tasks for c in t.children(recursive=True))]:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGUSR2)


def shard_hashes(run_dir: RunDir, step: int) -> dict[str, str]:
    manifest = json.loads((run_dir.checkpoints / f"step_{step:07d}" / "manifest.json").read_text())
    return {f["path"]: f["sha256"] for f in manifest["files"] if f["path"].endswith(".distcp")}


def test_preempted_twice_matches_an_uninterrupted_run_bit_for_bit(corpus: Path, tmp_path: Path) -> None:
    reference, handle = submit(tmp_path, corpus, "reference")
    assert [r.exit_code for r in handle.results()] == [ExitCode.OK] * 4

    run_dir, handle = submit(tmp_path, corpus, "preempted")
    wait_for("step 2", lambda: last_step(run_dir) >= 2)
    signal_tasks(handle)
    wait_for("the first resume", lambda: kinds(run_dir, "resume"))
    first_resume = kinds(run_dir, "resume")[0]["step"]
    wait_for("two steps after the resume", lambda: last_step(run_dir) >= first_resume + 2)
    signal_tasks(handle)
    assert [r.exit_code for r in handle.results()] == [ExitCode.OK] * 4

    expected = [(r["step"], r["loss"]) for r in read_metrics(reference.metrics)]
    assert [(r["step"], r["loss"]) for r in read_metrics(run_dir.metrics)] == expected
    assert len(expected) == STEPS
    stops, resumes = kinds(run_dir, "stop"), kinds(run_dir, "resume")
    assert [e["reason"] for e in stops] == ["signal", "signal"]
    assert [e["step"] for e in resumes] == [e["step"] for e in stops]  # no step lost
    assert stops[0]["step"] < stops[1]["step"]
    assert all(e["rng_restored"] and not e["layout_changed"] for e in resumes)
    saved = {e["step"]: e for e in kinds(run_dir, "checkpoint_saved")}
    assert all(saved[e["step"]]["async"] is False for e in stops)  # preemption saves are synchronous
    assert shard_hashes(run_dir, STEPS) == shard_hashes(reference, STEPS)  # the final weights, byte for byte
