"""The Checkpointer's own paths on one real gloo rank (in this process), and the stop agreement on two.

One rank is enough for what multi-rank runs cannot easily provoke: a background writer that
dies, a sync write that raises. Both must fail the save loudly on every rank (here: the one),
leave the previous checkpoint as the latest, and let the next save succeed. Two processes
show that a signal on one rank, or a deadline on one rank's clock, stops both, for one reason.
"""

import contextlib
import functools
import json
import multiprocessing
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from air_hpc.config.layout import ParallelLayout
from air_hpc.errors import CheckpointError, UnusableCheckpointsError
from air_hpc.records.events import EventLog, read_events
from air_hpc.resilience import state
from air_hpc.resilience.checkpointer import Checkpointer
from air_hpc.resilience.store import MANIFEST, CheckpointStore, sha256_file
from tests.integration.waiting import wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
LAYOUT = ParallelLayout(tp=1, pp=1, dp=1)


@pytest.fixture(scope="module")
def model() -> Iterator[Any]:
    """gpt-tiny on one gloo rank (TP1 x PP1), built by the trainer's own code."""
    import torch

    from air_hpc.backend import megatron_compat
    from air_hpc.config import load_job
    from air_hpc.train import model as model_mod
    from air_hpc.train import parallel

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
        stack.enter_context(megatron_compat.cpu_patched())
        ctx = stack.enter_context(parallel.distributed(env, job.layout, "gloo", 60))
        parallel.seed(ctx, job.train.seed)
        built = model_mod.build(job, ctx)
        built.optimizer.step()  # zero gradients: creates Adam's state, as any real step would
        yield built


def save(ckpt: Checkpointer, model: Any, step: int, sync: bool) -> None:
    ckpt.save(step, model.state().at(consumed_samples=step), sync=sync)


def test_async_save_commits_after_poll_and_wait(model: Any, tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoints", keep_last=2)
    ckpt = Checkpointer(store, EventLog(tmp_path / "events.jsonl"), async_save=True, layout=LAYOUT)
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
    ckpt = Checkpointer(store, events, async_save=True, layout=LAYOUT)
    save(ckpt, model, 1, sync=True)
    with monkeypatch.context() as patch:
        patch.setattr(state, "run_request", _failing_write)  # the forked writer inherits it
        with pytest.raises(CheckpointError, match="saving step 2 failed"):
            save(ckpt, model, 2, sync=sync)  # a sync save fails here; an async one at the next wait/poll
            ckpt.wait()
    assert store.latest_complete() == 1 and store.latest_pointer() == 1
    assert store.partial() == []  # the failed save's staging directory is gone
    failed = [e for e in read_events(events.path) if e["kind"] == "checkpoint_failed"]
    assert [e["step"] for e in failed] == [2] and failed[0]["why"].endswith(
        ".tmp-step_0000002: No space left on device (errno 28, ENOSPC)"
    )
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
    ckpt = Checkpointer(store, events, async_save=True, layout=LAYOUT)
    worker = save_with_stuck_writer(ckpt, model, 2, tmp_path, monkeypatch)
    writer = ckpt._pending.writer if ckpt._pending else None
    started = time.monotonic()
    # a preemption's save must not wait for the stuck writer
    ckpt.save(3, model.state().at(consumed_samples=3), sync=True, supersede=True)
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
    ckpt = Checkpointer(store, events, async_save=True, async_wait_s=1, layout=LAYOUT)
    save(ckpt, model, 1, sync=True)
    worker = save_with_stuck_writer(ckpt, model, 2, tmp_path, monkeypatch)
    started = time.monotonic()
    save(ckpt, model, 3, sync=False)  # the interval save after the stuck one: waits 1 s, then goes on
    assert 1 <= time.monotonic() - started < 30
    wait_for("the worker to be gone", lambda: _gone(worker), 30)
    wait_for("step 3's writer to report", ckpt.poll, 120)  # close() would give it async_wait_s (1 s) only
    ckpt.close()
    assert store.committed_steps() == [1, 3] and store.latest_complete() == 3
    failed = [e for e in read_events(events.path) if e["kind"] == "checkpoint_failed"]
    assert [e["step"] for e in failed] == [2] and "did not finish within 1 s" in failed[0]["why"]


def test_resume_finds_the_newest_and_restores_progress(model: Any, tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoints", keep_last=5)
    ckpt = Checkpointer(store, EventLog(tmp_path / "events.jsonl"), async_save=False, layout=LAYOUT)
    assert ckpt.resume(model.state()) is None  # the first start
    save(ckpt, model, 4, sync=True)
    loaded = ckpt.resume(model.state())
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


@contextlib.contextmanager
def mounted(target: Path, *mount_args: str) -> Iterator[Path]:
    """``mount ARGS TARGET`` (CI runs as root), unmounted afterwards; skips where mounting is not allowed."""
    target.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", *mount_args, str(target)], capture_output=True, text=True, check=False)
    if done.returncode:
        pytest.skip(f"cannot mount here: {done.stderr.strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=True)


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_a_full_disk_fails_the_save_with_path_and_errno_and_removes_it(model: Any, tmp_path: Path, sync: bool) -> None:
    with mounted(tmp_path / "small", "-t", "tmpfs", "-o", "size=1m", "tmpfs") as small:
        store = CheckpointStore(small / "checkpoints", keep_last=5)
        events = EventLog(tmp_path / "events.jsonl")
        ckpt = Checkpointer(store, events, async_save=True, layout=LAYOUT)
        with pytest.raises(CheckpointError) as failed:
            save(ckpt, model, 1, sync=sync)  # 3.6 MB of shards on a 1 MB file system
            ckpt.wait()
        message = str(failed.value)
        assert message.startswith(f"saving step 1 failed: {small}/checkpoints/.tmp-step_0000001"), message
        assert "No space left on device (errno 28, ENOSPC" in message and "\n" not in message
        assert store.partial() == [] and store.committed_steps() == []
        assert not list((small / "checkpoints").iterdir())  # nothing left on the full disk
        failed_events = [e for e in read_events(events.path) if e["kind"] == "checkpoint_failed"]
        assert [e["step"] for e in failed_events] == [1] and "errno 28, ENOSPC" in failed_events[0]["why"]


def test_a_read_only_file_system_fails_the_save_in_one_line(model: Any, tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    store = CheckpointStore(root / "checkpoints", keep_last=5)
    events = EventLog(tmp_path / "events.jsonl")
    ckpt = Checkpointer(store, events, async_save=False, layout=LAYOUT)
    save(ckpt, model, 1, sync=True)
    ckpt.close()
    read_only = r"^saving step 2 failed: .*: Read-only file system \(errno 30, EROFS\)$"
    with mounted(root, "-o", "bind,ro", str(root)), pytest.raises(CheckpointError, match=read_only):
        save(ckpt, model, 2, sync=True)
    assert store.committed_steps() == [1] and store.latest_complete() == 1
    failed = [e for e in read_events(events.path) if e["kind"] == "checkpoint_failed"]
    assert [e["step"] for e in failed] == [2] and "EROFS" in failed[0]["why"]


def test_resume_refuses_to_start_over_checkpoints_that_all_fail(model: Any, tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoints", keep_last=5)
    events = EventLog(tmp_path / "events.jsonl")
    ckpt = Checkpointer(store, events, async_save=False, layout=LAYOUT)
    for step in (1, 2):
        save(ckpt, model, step, sync=True)
    ckpt.close()
    for step in (1, 2):
        shard = next(store.path(step).glob("*.distcp"))
        data = bytearray(shard.read_bytes())
        data[1000] ^= 0xFF
        shard.write_bytes(bytes(data))
    with pytest.raises(UnusableCheckpointsError) as refused:
        ckpt.resume(model.state())
    assert refused.value.exit_code == 2
    message = str(refused.value)
    assert all(str(next(store.path(s).glob("*.distcp"))) in message for s in (1, 2))
    assert "checkpoint.allow_fresh_start=true" in message
    fresh = Checkpointer(store, events, async_save=False, allow_fresh_start=True, layout=LAYOUT)
    assert fresh.resume(model.state()) is None
    assert store.committed_steps() == [1, 2]  # kept: they may still be recoverable
    assert [e["kind"] for e in read_events(events.path)][-1] == "fresh_start"


class _Planted:
    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, ("touch planted-pickle-ran",))


def test_a_planted_pickle_is_skipped_like_a_corrupt_checkpoint(
    model: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = CheckpointStore(tmp_path / "checkpoints", keep_last=5)
    events = EventLog(tmp_path / "events.jsonl")
    ckpt = Checkpointer(store, events, async_save=False, layout=LAYOUT)
    for step in (1, 2):
        save(ckpt, model, step, sync=True)
    ckpt.close()
    # An attacker rewrites .metadata and the manifest with it, so sizes and hashes all match.
    directory = store.path(2)
    (directory / ".metadata").write_bytes(pickle.dumps(_Planted()))
    manifest = json.loads((directory / MANIFEST).read_text())
    for entry in manifest["files"]:
        entry["bytes"] = (directory / entry["path"]).stat().st_size
        entry["sha256"] = sha256_file(directory / entry["path"])
    (directory / MANIFEST).write_text(json.dumps(manifest))
    loaded = ckpt.resume(model.state())
    assert loaded is not None and loaded.step == 1
    assert not (tmp_path / "planted-pickle-ran").exists()
    skipped = [e for e in read_events(events.path) if e["kind"] == "checkpoint_skipped"]
    assert [e["step"] for e in skipped] == [2] and "global 'posix.system' is not allowed" in skipped[0]["why"]


RANK_WITH_STUCK_WRITER = """
import multiprocessing, os, socket, sys, time
from pathlib import Path
from air_hpc.resilience import state, writer

def stuck(request, stage_to_host=False, results=None):
    worker = multiprocessing.get_context("fork").Process(target=time.sleep, args=(3600,))
    worker.start()
    Path(sys.argv[1]).write_text(f"{os.getpid()} {worker.pid}")
    time.sleep(3600)

listener = socket.create_server(("127.0.0.1", 0))  # as rank 0's TCPStore listens on the rendezvous port
Path(sys.argv[2], "port").write_text(str(listener.getsockname()[1]))
state.run_request = stuck
writer.Writer.start(state.DistCheckpoint(None), None, Path(sys.argv[2]), 0)
if sys.argv[3] == "sibling":  # a child the rank forks later inherits all the rank holds
    sibling = multiprocessing.get_context("fork").Process(target=time.sleep, args=(3600,))
    sibling.start()
    Path(sys.argv[2], "sibling").write_text(str(sibling.pid))
time.sleep(3600)
"""


@contextlib.contextmanager
def rank_with_stuck_writer(tmp_path: Path, sibling: bool) -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    """A rank whose async writer (and the worker it forked) hangs; yields the rank, the writer's and worker's pids."""
    pids = tmp_path / "pids"
    argv = [sys.executable, "-c", RANK_WITH_STUCK_WRITER, str(pids), str(tmp_path), "sibling" if sibling else "-"]
    rank = subprocess.Popen(argv, cwd=REPO)
    try:
        # write_text is not atomic: the file exists a moment before it holds both pids
        wait_for("the writer's worker", lambda: pids.exists() and len(pids.read_text().split()) == 2, 60)
        if sibling:
            wait_for(
                "the rank's later child",
                lambda: bool((tmp_path / "sibling").exists() and (tmp_path / "sibling").read_text()),
                60,
            )
        writer, worker = (int(p) for p in pids.read_text().split())
        yield rank, writer, worker
    finally:
        rank.kill()
        rank.wait()
        for name in ("pids", "sibling"):  # what the test started, by pid, should it have outlived the rank
            for pid in (tmp_path / name).read_text().split() if (tmp_path / name).exists() else ():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)


@pytest.mark.parametrize("sibling", [False, True], ids=["alone", "with-a-later-child"])
def test_a_writer_and_its_workers_die_with_their_rank(tmp_path: Path, sibling: bool) -> None:
    """However the rank ends, and though a child the rank forked later (holding all the rank held) lives on."""
    with rank_with_stuck_writer(tmp_path, sibling) as (rank, writer, worker):
        rank.kill()  # kill -9: no handler, no cleanup in the rank
        rank.wait()
        wait_for("the writer and its worker to be gone", lambda: _gone(writer) and _gone(worker), 10)


def test_a_writer_never_holds_the_rank_s_listening_port(tmp_path: Path) -> None:
    with rank_with_stuck_writer(tmp_path, sibling=False) as (_, writer, worker):
        port = int((tmp_path / "port").read_text())
        for pid in (writer, worker):
            held = [c.laddr.port for c in psutil.Process(pid).net_connections("inet")]
            assert port not in held, f"pid {pid} holds the rank's port {port}: {held}"
