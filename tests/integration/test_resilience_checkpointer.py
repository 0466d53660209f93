"""The Checkpointer's own paths on one real gloo rank (in this process), and the stop agreement on two.

One rank is enough for what multi-rank runs cannot easily provoke: a background writer that
dies, a sync write that raises. Both must fail the save loudly on every rank (here: the one),
leave the previous checkpoint as the latest, and let the next save succeed. Two processes
show that a signal on one rank, or a deadline on one rank's clock, stops both, for one reason.
"""

import contextlib
import functools
import multiprocessing
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from air_hpc.errors import CheckpointError
from air_hpc.resilience import state
from air_hpc.resilience.checkpointer import Checkpointer
from air_hpc.resilience.events import EventLog, read_events
from air_hpc.resilience.store import CheckpointStore
from tests.integration.waiting import wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model() -> Iterator[Any]:
    """gpt-tiny on one gloo rank (TP1 x PP1), built by the trainer's own code."""
    import torch

    from air_hpc.config import load_job
    from air_hpc.train import cpu_compat, parallel
    from air_hpc.train import model as model_mod

    torch.set_num_threads(1)
    job = load_job(
        REPO / "configs/jobs/gpt-tiny-local.yaml",
        ["resources.tasks_per_node=1", "parallel.tp=1", "parallel.pp=1", "train.global_batch_size=2"],
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    env = parallel.DistEnv(0, 1, 0, "127.0.0.1", port, "localhost")
    with contextlib.ExitStack() as stack:
        stack.enter_context(cpu_compat.patched())
        ctx = stack.enter_context(parallel.distributed(env, job.layout, "gloo", 60))
        parallel.seed(ctx, job.train.seed)
        built = model_mod.build(job, ctx)
        built.optimizer.step()  # zero gradients: creates Adam's state, as any real step would
        yield built


def save(ckpt: Checkpointer, model: Any, step: int, sync: bool) -> None:
    ckpt.save(step, model.chunks, model.optimizer, model.scheduler, {"consumed_samples": step}, sync=sync)


def test_async_save_commits_after_poll_and_wait(model: Any, tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoints", keep_last=2)
    ckpt = Checkpointer(store, EventLog(tmp_path / "events.jsonl"), async_save=True)
    save(ckpt, model, 1, sync=False)
    assert ckpt.writing and store.committed_steps() == []  # nothing visible before the commit
    while not ckpt.poll():
        pass
    ckpt.wait()
    assert store.latest_complete() == 1 and not ckpt.busy
    for step in (2, 3):
        save(ckpt, model, step, sync=False)
    ckpt.close()
    assert store.committed_steps() == [2, 3]  # keep_last=2, applied after each commit
    saved = [e for e in read_events(tmp_path / "events.jsonl") if e["kind"] == "checkpoint_saved"]
    assert [e["step"] for e in saved] == [1, 2, 3] and all(e["async"] for e in saved)


def _failing_write(request: Any, stage_to_host: bool = False, results: Any = None) -> None:
    raise OSError(28, "No space left on device")


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_a_failed_write_fails_the_save_and_keeps_the_previous_checkpoint(
    model: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync: bool
) -> None:
    store = CheckpointStore(tmp_path / "checkpoints", keep_last=5)
    events = EventLog(tmp_path / "events.jsonl")
    ckpt = Checkpointer(store, events, async_save=True)
    save(ckpt, model, 1, sync=True)
    with monkeypatch.context() as patch:
        patch.setattr(state, "run_request", _failing_write)  # the forked writer inherits it
        with pytest.raises(CheckpointError, match="saving step 2 failed"):
            save(ckpt, model, 2, sync=sync)  # a sync save fails here; an async one at the next wait/poll
            ckpt.wait()
    assert store.latest_complete() == 1 and store.latest_pointer() == 1
    assert [p.name for p in store.partial()] == [".tmp-step_0000002"]
    failed = [e for e in read_events(events.path) if e["kind"] == "checkpoint_failed"]
    assert failed[0]["step"] == 2 and ("No space left" in failed[0]["why"] or "writer" in failed[0]["why"])
    save(ckpt, model, 3, sync=sync)  # the next save cleans up and succeeds
    ckpt.close()
    assert store.committed_steps() == [1, 3] and store.partial() == []


def _stuck_write(request: Any, stage_to_host: bool = False, results: Any = None, *, pid_file: Path) -> None:
    """Like Megatron's writer, forks a worker (one per write bucket there); here both hang."""
    worker = multiprocessing.get_context("fork").Process(target=time.sleep, args=(3600,))
    worker.start()
    pid_file.write_text(str(worker.pid))
    time.sleep(3600)


def save_with_stuck_writer(ckpt: Checkpointer, model: Any, step: int, tmp_path: Path, patch: pytest.MonkeyPatch) -> int:
    """Start an async save of ``step`` whose writer and its worker hang; returns the worker's pid."""
    worker_pid = tmp_path / "worker.pid"
    with patch.context() as scoped:  # the forked writer inherits the patch and never reports
        scoped.setattr(state, "run_request", functools.partial(_stuck_write, pid_file=worker_pid))
        save(ckpt, model, step, sync=False)
    wait_for("the stuck writer's worker", worker_pid.exists, 30)
    return int(worker_pid.read_text())


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_preemption_save_supersedes_an_unfinished_async_write(
    model: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(tmp_path / "checkpoints", keep_last=5)
    events = EventLog(tmp_path / "events.jsonl")
    ckpt = Checkpointer(store, events, async_save=True)
    worker = save_with_stuck_writer(ckpt, model, 2, tmp_path, monkeypatch)
    writer = ckpt._pending.process if ckpt._pending else None
    started = time.monotonic()
    # a preemption's save must not wait for the stuck writer
    ckpt.save(3, model.chunks, model.optimizer, model.scheduler, {"consumed_samples": 3}, sync=True, supersede=True)
    ckpt.close()
    assert time.monotonic() - started < 60
    assert writer is not None and not writer.is_alive()
    wait_for("the worker to be gone", lambda: _gone(worker), 30)  # an orphan would hold the rank's sockets
    assert store.committed_steps() == [3] and store.latest_complete() == 3
    skipped = [e for e in read_events(events.path) if e["kind"] == "checkpoint_skipped"]
    assert [(e["step"], e["why"]) for e in skipped] == [(2, "superseded by the save of step 3")]


def test_a_save_abandons_async_writers_that_do_not_report_in_time(
    model: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(tmp_path / "checkpoints", keep_last=5)
    events = EventLog(tmp_path / "events.jsonl")
    ckpt = Checkpointer(store, events, async_save=True, async_wait_s=1)
    save(ckpt, model, 1, sync=True)
    worker = save_with_stuck_writer(ckpt, model, 2, tmp_path, monkeypatch)
    started = time.monotonic()
    save(ckpt, model, 3, sync=False)  # the interval save after the stuck one: waits 1 s, then goes on
    assert 1 <= time.monotonic() - started < 30
    wait_for("the worker to be gone", lambda: _gone(worker), 30)
    ckpt.close()
    assert store.committed_steps() == [1, 3] and store.latest_complete() == 3
    failed = [e for e in read_events(events.path) if e["kind"] == "checkpoint_failed"]
    assert [e["step"] for e in failed] == [2] and "did not finish within 1 s" in failed[0]["why"]


def test_resume_finds_the_newest_and_restores_progress(model: Any, tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoints", keep_last=5)
    ckpt = Checkpointer(store, EventLog(tmp_path / "events.jsonl"), async_save=False)
    assert ckpt.resume(model.chunks, model.optimizer, model.scheduler) is None  # the first start
    save(ckpt, model, 4, sync=True)
    loaded = ckpt.resume(model.chunks, model.optimizer, model.scheduler)
    assert loaded is not None and loaded.step == 4 and loaded.extra == {"consumed_samples": 4}
    assert loaded.rng_restored and not loaded.layout_changed
    assert os.path.isfile(store.path(4) / state.STATE_FILE)


def agree_worker(rank: int, port: int, out: str) -> None:
    """Rank 1 got a signal, rank 0's clock says the deadline passed: what does each rank decide?"""
    import json

    import torch.distributed as dist

    from air_hpc.resilience.signals import Deadline, StopRequest, agree, agree_stop

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    stop = StopRequest()
    quiet = agree_stop(stop, Deadline(100.0, "explicit"), now_s=50.0)
    late = agree_stop(stop, Deadline(100.0, "explicit"), now_s=150.0 if rank == 0 else 50.0)
    if rank == 1:
        stop._handle(12, None)
    signalled = agree_stop(stop, Deadline(100.0, "explicit"), now_s=150.0 if rank == 0 else 50.0)
    flags = [agree(rank == 1), agree(False)]
    dist.destroy_process_group()
    Path(out).write_text(json.dumps([quiet, late, signalled, *flags]))


def test_ranks_agree_on_stopping_and_why(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    code = "import sys; from tests.integration.test_resilience_checkpointer import agree_worker as w; "
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code + f"w({rank}, {port}, sys.argv[1])", str(tmp_path / f"{rank}.json")],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
        )
        for rank in range(2)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    decisions = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2)]
    assert decisions == [[None, "deadline", "signal", True, False]] * 2
