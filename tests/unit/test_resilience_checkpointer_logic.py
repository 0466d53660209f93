"""The Checkpointer's async, wait, abandon and supersede logic, with fake collectives and a fake format.

The writer is still a real forked process and the store a real directory; only the process
group (other ranks answer from a script) and Megatron's format are fakes. The same paths run
against real gloo ranks and real ``dist_checkpointing`` in
``tests/integration/test_resilience_checkpointer.py``.
"""

from collections import deque
from pathlib import Path

import pytest

from air_hpc.config.layout import ParallelLayout
from air_hpc.errors import CheckpointError, UnusableCheckpointsError
from air_hpc.records.events import EventLog, read_events
from air_hpc.resilience.checkpointer import Checkpointer
from air_hpc.resilience.store import CheckpointStore
from air_hpc.resilience.writer import Writer
from tests.unit.checkpoint_fakes import NO_STATE, FakeCollectives, FakeFormat

LAYOUT = ParallelLayout(tp=1, pp=1, dp=2)


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(tmp_path / "checkpoints", keep_last=5)


def checkpointer(store: CheckpointStore, fmt: FakeFormat, comm: FakeCollectives, **options: float) -> Checkpointer:
    events = EventLog(store.root.parent / "events.jsonl")
    return Checkpointer(
        store,
        events,
        True,
        layout=LAYOUT,
        checkpoint_format=fmt,
        collectives=comm,
        **options,  # type: ignore[arg-type]
    )


def save(ckpt: Checkpointer, step: int, *, sync: bool = False, supersede: bool = False) -> None:
    ckpt.save(step, NO_STATE, sync=sync, supersede=supersede, reason="test")


def writer_of(ckpt: Checkpointer) -> Writer:
    """The forked writer of the save in flight."""
    assert ckpt._pending is not None and ckpt._pending.writer is not None
    return ckpt._pending.writer


def kinds(store: CheckpointStore, kind: str) -> list[dict[str, object]]:
    return [e for e in read_events(store.root.parent / "events.jsonl") if e["kind"] == kind]


def test_an_async_save_commits_only_after_every_rank_reported(store: CheckpointStore, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    fmt, comm = FakeFormat(gate=gate), FakeCollectives()
    ckpt = checkpointer(store, fmt, comm)
    save(ckpt, 1)
    assert ckpt.writing and not ckpt.poll()  # our writer waits at the gate
    gate.touch()
    ckpt._pending.unreported(5.0)  # type: ignore[union-attr]  # our writer has reported now
    comm.peers_any.append(True)  # ... but another rank's has not
    assert not ckpt.poll() and ckpt.writing
    assert ckpt.poll()  # every rank reported: finalized
    ckpt.wait()
    assert fmt.finalized == [1] and store.latest_complete() == 1 and not ckpt.busy
    assert [e["async"] for e in kinds(store, "checkpoint_saved")] == [True]


def test_a_supersede_stops_the_unfinished_write_and_saves_the_new_step(store: CheckpointStore, tmp_path: Path) -> None:
    fmt = FakeFormat(gate=tmp_path / "gate")
    ckpt = checkpointer(store, fmt, FakeCollectives())
    save(ckpt, 1)
    writer = writer_of(ckpt)
    fmt.gate = None  # the preemption's save writes at once (in this process)
    save(ckpt, 2, sync=True, supersede=True)
    assert not writer.is_alive() and writer.exitcode is not None
    assert store.committed_steps() == [2] and store.latest_pointer() == 2
    assert [(e["step"], e["why"]) for e in kinds(store, "checkpoint_skipped")] == [
        (1, "superseded by the save of step 2")
    ]
    ckpt.close()


def test_a_supersede_keeps_a_write_that_every_rank_finished(store: CheckpointStore) -> None:
    ckpt = checkpointer(store, FakeFormat(), FakeCollectives())
    save(ckpt, 1)
    ckpt._pending.unreported(5.0)  # type: ignore[union-attr]
    save(ckpt, 2, sync=True, supersede=True)
    assert store.committed_steps() == [1, 2] and kinds(store, "checkpoint_skipped") == []


def test_a_save_waits_for_the_previous_one_then_abandons_it_past_async_wait_s(
    store: CheckpointStore, tmp_path: Path
) -> None:
    fmt = FakeFormat(gate=tmp_path / "gate")
    ckpt = checkpointer(store, fmt, FakeCollectives(), async_wait_s=0.2)
    save(ckpt, 1)
    writer = writer_of(ckpt)
    fmt.gate = None
    save(ckpt, 2)  # waits for step 1's writer at most 0.2 s, then kills it
    assert not writer.is_alive()
    ckpt.close()
    assert store.committed_steps() == [2] and store.partial() == []
    failed = kinds(store, "checkpoint_failed")
    assert [e["step"] for e in failed] == [1] and "did not finish within 0.2 s" in str(failed[0]["why"])


def test_a_write_that_fails_fails_the_save_at_the_next_wait(store: CheckpointStore) -> None:
    fmt = FakeFormat(fail_write=OSError(28, "No space left on device"))
    ckpt = checkpointer(store, fmt, FakeCollectives())
    save(ckpt, 1)
    with pytest.raises(CheckpointError, match=r"saving step 1 failed: .*No space left on device"):
        ckpt.wait()
    assert store.committed_steps() == [] and store.partial() == []
    fmt.fail_write = None
    save(ckpt, 2, sync=True)
    assert store.committed_steps() == [2]


def test_a_failure_on_another_rank_fails_the_save_here_too(store: CheckpointStore) -> None:
    comm = FakeCollectives(peers_any=deque([False, True]))  # staging ok everywhere; a peer's write failed
    ckpt = checkpointer(store, FakeFormat(), comm)
    with pytest.raises(CheckpointError, match="saving step 1 failed: on another rank"):
        save(ckpt, 1, sync=True)
    assert store.committed_steps() == [] and [e["step"] for e in kinds(store, "checkpoint_failed")] == [1]


def test_a_sync_save_ends_with_a_barrier_so_no_rank_leaves_while_rank_0_commits(store: CheckpointStore) -> None:
    comm = FakeCollectives()
    save(checkpointer(store, FakeFormat(), comm), 1, sync=True)
    assert comm.calls[-1] == "barrier" and store.latest_complete() == 1


def test_resume_skips_a_checkpoint_another_rank_found_corrupt(store: CheckpointStore) -> None:
    ckpt = checkpointer(store, FakeFormat(), FakeCollectives())
    for step in (1, 2):
        save(ckpt, step, sync=True)
    comm = FakeCollectives(peer_problems=deque(["rank 1: shard.bin: sha256 mismatch"]))
    loaded = checkpointer(store, FakeFormat(), comm).resume(NO_STATE)
    assert loaded is not None and loaded.step == 1
    assert [(e["step"], e["why"]) for e in kinds(store, "checkpoint_skipped")] == [
        (2, "rank 1: shard.bin: sha256 mismatch")
    ]


def test_resume_refuses_to_start_over_when_every_checkpoint_is_bad(store: CheckpointStore) -> None:
    save(checkpointer(store, FakeFormat(), FakeCollectives()), 1, sync=True)
    comm = FakeCollectives(peer_problems=deque(["rank 1: corrupt"]))
    with pytest.raises(UnusableCheckpointsError, match="all 1 checkpoint"):
        checkpointer(store, FakeFormat(), comm).resume(NO_STATE)


def test_an_error_stops_the_writer_without_a_collective_and_a_normal_exit_closes(
    store: CheckpointStore, tmp_path: Path
) -> None:
    comm = FakeCollectives()
    ckpt = checkpointer(store, FakeFormat(gate=tmp_path / "gate"), comm)
    with pytest.raises(RuntimeError, match="a step failed"), ckpt:
        save(ckpt, 1)
        writer = writer_of(ckpt)
        collectives_before = list(comm.calls)
        raise RuntimeError("a step failed")
    assert not writer.is_alive() and not ckpt.busy
    assert comm.calls == collectives_before  # the other ranks may be gone: nothing waits for them
    assert store.committed_steps() == []
    with checkpointer(store, FakeFormat(), comm) as ckpt:
        save(ckpt, 2)
    assert store.committed_steps() == [2] and not ckpt.busy
