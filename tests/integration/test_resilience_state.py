"""Checkpoints of a real Megatron-core GPT on CPU/gloo ranks: exact resume, resharding, safe loading.

Each test starts real rank processes (``python -c`` running :func:`worker_main`), each
building gpt-tiny through ``air_hpc.train`` and saving/loading through
``air_hpc.resilience.checkpointer``. Losses are compared exactly (same layout) or
within float tolerance (resharded).
"""

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from air_hpc.records.events import read_events
from air_hpc.resilience.store import CheckpointStore

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "configs" / "jobs" / "gpt-tiny-local.yaml"

pytestmark = pytest.mark.integration


# -- the rank process ---------------------------------------------------------------------------
def worker_main(spec_json: str) -> None:
    """One rank: build gpt-tiny, resume if asked, train, save as asked, report losses as JSON."""
    import contextlib
    import logging

    spec = json.loads(spec_json)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s rank{spec['rank']} %(levelname)s %(name)s: %(message)s"
    )
    import torch

    torch.set_num_threads(1)
    from air_hpc.backend import megatron_compat
    from air_hpc.config import load_job
    from air_hpc.data.blend import open_samples
    from air_hpc.records.events import EventLog
    from air_hpc.records.rundir import RunDir
    from air_hpc.resilience.checkpointer import Checkpointer
    from air_hpc.resilience.store import CheckpointStore
    from air_hpc.train import model as model_mod
    from air_hpc.train import parallel
    from air_hpc.train.loop import StepRunner

    job = load_job(str(JOB), tuple(spec["overrides"]))
    run = RunDir(Path(spec["run_dir"]))
    env = parallel.DistEnv(spec["rank"], spec["world"], spec["rank"], "127.0.0.1", spec["port"], "localhost")
    results: dict[str, Any] = {"losses": {}}
    with contextlib.ExitStack() as stack:
        stack.enter_context(megatron_compat.cpu_patched())
        ctx = stack.enter_context(parallel.distributed(env, job.layout, "gloo", 120))
        parallel.seed(ctx, job.train.seed)
        model = model_mod.build(job, ctx)
        samples = open_samples(job)
        runner = StepRunner(job, ctx, model, samples)
        store = CheckpointStore(run.checkpoints, job.checkpoint.keep_last, job.checkpoint.keep_every)
        ckpt = Checkpointer(store, EventLog(run.events), spec["async"], layout=ctx.layout, verify=job.checkpoint.verify)
        first = 1
        loaded = ckpt.resume(model.state())
        if loaded is not None:
            first = loaded.step + 1
            results["resumed"] = {"step": loaded.step, "layout_changed": loaded.layout_changed}
        for step in range(first, spec["steps"] + 1):
            consumed = (step - 1) * job.train.global_batch_size
            result = runner.step(consumed)
            if ctx.is_last_stage:
                results["losses"][str(step)] = result.loss
            ckpt.poll()
            if spec.get("die_in_save_at") == [spec["rank"], step]:
                _die_after_writing_shards()
            if step in spec["save_at"]:
                training = model.state().at(consumed_samples=step * job.train.global_batch_size)
                ckpt.save(step, training, sync=not spec["async"])
        ckpt.close()
        results["weights"] = {name: float(p.detach().double().sum()) for name, p in model.chunks[0].named_parameters()}
        results["tp_pp"] = [ctx.tp_rank, ctx.pp_rank, ctx.dp_rank]
    Path(spec["out"]).write_text(json.dumps(results))


def _die_after_writing_shards() -> None:
    """Make this rank SIGKILL itself right after writing its shards, before finalize and commit."""
    from air_hpc.resilience import state

    write = state.run_request

    def write_then_die(request: Any, stage_to_host: bool = False, results: Any = None) -> None:
        write(request, stage_to_host, results)
        os.kill(os.getpid(), signal.SIGKILL)

    state.run_request = write_then_die


# -- the harness --------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_ranks(run_dir: Path, tag: str, world: int = 4, **spec: Any) -> list[tuple[subprocess.Popen[bytes], Path]]:
    port = free_port()
    procs = []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    for rank in range(world):
        out = run_dir / f"{tag}-rank{rank}.json"
        full = {"rank": rank, "world": world, "port": port, "run_dir": str(run_dir), "out": str(out), **spec}
        log = open(run_dir / f"{tag}-rank{rank}.log", "wb")  # noqa: SIM115 (closed with the process)
        code = "import sys; from tests.integration.test_resilience_state import worker_main; worker_main(sys.argv[1])"
        proc = subprocess.Popen(
            [sys.executable, "-c", code, json.dumps(full)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # one process group per rank: cleanup reaches its forked writers
        )
        procs.append((proc, out))
    return procs


def kill_ranks(procs: list[tuple[subprocess.Popen[bytes], Path]]) -> None:
    """SIGKILL every rank's process group (the rank and anything it forked) that is still there."""
    for proc, _ in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_ranks(procs: list[tuple[subprocess.Popen[bytes], Path]], timeout_s: float = 240) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    try:
        for proc, _ in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        kill_ranks(procs)
    failed = [(i, p.returncode) for i, (p, _) in enumerate(procs) if p.returncode != 0]
    if failed:
        logs = "\n".join(Path(str(out).replace(".json", ".log")).read_text()[-3000:] for _, out in procs)
        raise AssertionError(f"ranks failed {failed}:\n{logs}")
    return [json.loads(out.read_text()) for _, out in procs]


def run_ranks(run_dir: Path, tag: str, world: int = 4, **spec: Any) -> list[dict[str, Any]]:
    return wait_ranks(start_ranks(run_dir, tag, world, **spec))


def losses(results: list[dict[str, Any]]) -> dict[int, float]:
    merged: dict[int, float] = {}
    for r in results:
        merged.update({int(k): v for k, v in r["losses"].items()})
    return merged


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from air_hpc.train.data import ByteTokenizer, prepare

    out = tmp_path_factory.mktemp("data") / "corpus.h5"
    prepare([REPO / "README.md", JOB], out, ByteTokenizer())
    return out


def overrides(corpus: Path, run_dir: Path, *extra: str) -> list[str]:
    return [
        f"data.path={corpus}",
        f"run.root={run_dir.parent}",
        f"run.name={run_dir.name}",
        "checkpoint.keep_last=5",
        *extra,
    ]


# -- tests --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reference(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, float], list[Any]]:
    """An uninterrupted TP2xPP2 run of 6 steps with async saves at steps 2 and 4."""
    run = tmp_path_factory.mktemp("reference") / "run"
    run.mkdir()
    results = run_ranks(run, "full", overrides=overrides(corpus, run), steps=6, save_at=[2, 4], **{"async": True})
    return run, losses(results), results


def copy_run(reference_run: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(reference_run / "checkpoints", run / "checkpoints", symlinks=False)
    return run


def test_async_saves_are_committed_with_events(reference: tuple[Path, dict[int, float], list[Any]]) -> None:
    run, reference_losses, _ = reference
    assert sorted(reference_losses) == [1, 2, 3, 4, 5, 6]
    store = CheckpointStore(run / "checkpoints", keep_last=5)
    assert store.committed_steps() == [2, 4] and store.latest_pointer() == 4
    assert store.partial() == []
    saved = [e for e in read_events(run / "events.jsonl") if e["kind"] == "checkpoint_saved"]
    assert [(e["step"], e["async"]) for e in saved] == [(2, True), (4, True)]
    assert all(e["bytes"] > 100_000 and e["stall_s"] <= e["seconds"] for e in saved)
    state = json.loads((store.path(4) / "air_hpc_state.json").read_text())
    assert state["step"] == 4 and state["extra"] == {"consumed_samples": 32}
    assert state["layout"] == {"tp": 2, "pp": 2, "dp": 1, "vpp": None}


def test_resume_falls_back_from_a_corrupt_checkpoint_and_is_exact(
    corpus: Path, reference: tuple[Path, dict[int, float], list[Any]], tmp_path: Path
) -> None:
    """A flipped byte in step 4 makes the resume fall back to step 2; the losses from there are exact.

    (Exact resume from the newest checkpoint, through the trainer, is test_resilience_preempt's.)
    """
    reference_run, reference_losses, reference_results = reference
    run = copy_run(reference_run, tmp_path)
    shard = sorted((run / "checkpoints" / "step_0000004").glob("*.distcp"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    fallback = run_ranks(run, "fallback", overrides=overrides(corpus, run), steps=6, save_at=[], **{"async": False})
    assert fallback[0]["resumed"] == {"step": 2, "layout_changed": False}
    assert losses(fallback) == {k: v for k, v in reference_losses.items() if k > 2}
    assert [r["weights"] for r in fallback] == [r["weights"] for r in reference_results]
    skipped = [e for e in read_events(run / "events.jsonl") if e["kind"] == "checkpoint_skipped"]
    assert skipped[-1]["step"] == 4 and shard.name in skipped[-1]["why"]


def test_rank_killed_mid_save_resumes_from_previous_checkpoint(
    corpus: Path, reference: tuple[Path, dict[int, float], list[Any]], tmp_path: Path
) -> None:
    """Rank 1 is SIGKILLed after writing its shards of step 4, before the commit; the job dies."""
    _, reference_losses, _ = reference
    run = tmp_path / "run"
    run.mkdir()
    ov = overrides(corpus, run)
    procs = start_ranks(run, "killed", overrides=ov, steps=6, save_at=[2, 4], die_in_save_at=[1, 4], **{"async": False})
    victim = procs[1][0]
    try:
        victim.wait(timeout=240)
    finally:
        kill_ranks(procs)  # what Slurm does to the other tasks of a failed step
    assert victim.returncode == -signal.SIGKILL
    store = CheckpointStore(run / "checkpoints", keep_last=5)
    assert store.committed_steps() == [2]
    assert [p.name for p in store.partial()] == [".tmp-step_0000004"]
    assert any((store.partial()[0]).glob("__1_*.distcp"))  # rank 1 had written its shards

    resumed = run_ranks(run, "resumed", overrides=ov, steps=6, save_at=[], **{"async": False})
    assert resumed[0]["resumed"]["step"] == 2
    assert losses(resumed) == {k: v for k, v in reference_losses.items() if k > 2}
    partial = [e for e in read_events(run / "events.jsonl") if e["kind"] == "checkpoint_partial"]
    assert partial and partial[0]["path"].endswith(".tmp-step_0000004")


@pytest.mark.parametrize("layout", ["parallel.tp=1", "parallel.pp=1"], ids=["tp1-pp2-dp2", "tp2-pp1-dp2"])
def test_resume_onto_another_layout_reshards(
    corpus: Path, reference: tuple[Path, dict[int, float], list[Any]], tmp_path: Path, layout: str
) -> None:
    reference_run, reference_losses, _ = reference
    run = copy_run(reference_run, tmp_path)
    resumed = run_ranks(
        run, "reshard", overrides=overrides(corpus, run, layout), steps=6, save_at=[6], **{"async": False}
    )
    assert resumed[0]["resumed"] == {"step": 4, "layout_changed": True}
    got = losses(resumed)
    assert sorted(got) == [5, 6]
    for step in (5, 6):
        assert got[step] == pytest.approx(reference_losses[step], rel=1e-4)
    resume_event = [e for e in read_events(run / "events.jsonl") if e["kind"] == "resume"][-1]
    assert resume_event["layout_changed"] is True and resume_event["rng_restored"] is False
    assert CheckpointStore(run / "checkpoints", keep_last=5).latest_complete() == 6


class _Planted:
    """Unpickling this writes a marker file: proof that a checkpoint ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (Path.write_text, (self.marker, "pwned"))  # type: ignore[return-value]


def test_real_checkpoints_pass_the_safe_loader_and_planted_objects_do_not_run(
    reference: tuple[Path, dict[int, float], list[Any]], tmp_path: Path
) -> None:
    import pickle

    import torch

    from air_hpc.errors import CheckpointError
    from air_hpc.resilience.safe_load import check_checkpoint

    reference_run, _, _ = reference
    real = reference_run / "checkpoints" / "step_0000004"
    check_checkpoint(real)  # every pickle in a real TP2xPP2 checkpoint is plain data
    marker = tmp_path / "marker"
    for name, payload in [
        (".metadata", pickle.dumps(_Planted(marker))),
        ("common.pt", None),
    ]:
        bad = tmp_path / name.strip(".")
        shutil.copytree(real, bad)
        if payload is None:
            torch.save({"optimizer": _Planted(marker)}, bad / name)
        else:
            (bad / name).write_bytes(payload)
        with pytest.raises(CheckpointError, match=f"{re.escape(name)}.*refusing to load"):
            check_checkpoint(bad)
    assert not marker.exists()
