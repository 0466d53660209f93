"""In-memory snapshots: the blob format, the per-node holder process, buddy choice, and restore from a holder.

The holder is the real ``python -m air_hpc.runtime.snapholder`` process on a Unix socket; the state
is a real torch module with Adam and an LR schedule, trained on after the restore to compare bit for bit.
"""

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from air_hpc.config.layout import ParallelLayout
from air_hpc.records.events import EventLog, read_events
from air_hpc.resilience import snapshot
from air_hpc.resilience.holder import HolderClient, HolderError, sealed_memfd, socket_path
from air_hpc.resilience.memory import MemorySnapshots, pick_buddies
from air_hpc.resilience.snapshot import SnapshotError, SnapshotInfo
from air_hpc.resilience.training_state import TrainingState

LAYOUT = ParallelLayout(tp=1, pp=1, dp=1, vpp=None)


def _state(seed: int = 0) -> TrainingState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return TrainingState((model,), optimizer, scheduler)  # type: ignore[arg-type]


def _train(training: TrainingState, steps: int) -> list[float]:
    """Steps whose batches come from the global RNG, so a restored RNG matters."""
    (model,) = training.model_chunks
    losses = []
    for _ in range(steps):
        x = torch.randn(5, 8)
        loss = model(x).pow(2).mean()  # type: ignore[operator]
        training.optimizer.zero_grad()  # type: ignore[attr-defined]
        loss.backward()
        training.optimizer.step()  # type: ignore[attr-defined]
        training.scheduler.step()  # type: ignore[union-attr]
        losses.append(loss.item())
    return losses


def _weights(training: TrainingState) -> list[torch.Tensor]:
    (model,) = training.model_chunks
    return [p.detach().clone() for p in model.parameters()]  # type: ignore[attr-defined]


def _blob(cap: snapshot.Capture) -> bytes:
    return b"".join(bytes(p) for p in cap.parts())


# -- format -------------------------------------------------------------------------------------
def test_restore_continues_bit_for_bit() -> None:
    reference = _state()
    _train(reference, 3)
    info = SnapshotInfo(0, 3, 1, LAYOUT)
    from air_hpc.resilience.state import capture_rng

    blob = _blob(snapshot.capture(info, snapshot.state_tree(reference.at(consumed_samples=24), capture_rng())).seal())
    expected = _train(reference, 4)
    other = _state(seed=1)  # another start: different weights, optimizer moments, schedule and RNG
    _train(other, 1)
    decoded = snapshot.decode(blob, info)
    snapshot.restore(other, decoded)
    assert decoded.tree["progress"] == {"consumed_samples": 24}
    assert _train(other, 4) == expected
    assert all(torch.equal(a, b) for a, b in zip(_weights(other), _weights(reference), strict=True))


def test_a_flipped_bit_is_refused() -> None:
    cap = snapshot.capture(SnapshotInfo(0, 1, 1, LAYOUT), {"w": torch.arange(100.0)}).seal()
    blob = bytearray(_blob(cap))
    blob[len(cap.header) + 17] ^= 0x04
    with pytest.raises(SnapshotError, match="checksum mismatch"):
        snapshot.decode(blob)
    with pytest.raises(SnapshotError, match="bad magic"):
        snapshot.decode(b"PK\x03\x04" + bytes(64))


def test_a_snapshot_of_another_step_or_rank_is_refused() -> None:
    blob = _blob(snapshot.capture(SnapshotInfo(1, 5, 2, LAYOUT), {"w": torch.ones(3)}).seal())
    with pytest.raises(SnapshotError, match="expected"):
        snapshot.decode(blob, SnapshotInfo(0, 5, 2, LAYOUT))


def test_values_outside_plain_data_are_refused_when_taken() -> None:
    with pytest.raises(SnapshotError, match=r"cannot store object at state\.x"):
        snapshot.capture(SnapshotInfo(0, 1, 1, LAYOUT), {"x": object()})


def test_tree_keeps_int_keys_tuples_none_and_bytes() -> None:
    import io

    tree = {"state": {0: {"step": torch.tensor(3.0)}}, "betas": (0.9, 0.95), "n": None, "extra": io.BytesIO(b"te")}
    blob = _blob(snapshot.capture(SnapshotInfo(0, 1, 1, LAYOUT), tree).seal())
    back = snapshot.decode(blob).tree
    assert list(back["state"]) == [0] and back["betas"] == (0.9, 0.95) and back["n"] is None
    assert back["extra"].getvalue() == b"te"


# -- buddies ------------------------------------------------------------------------------------
def test_buddies_sit_on_another_node() -> None:
    plan = pick_buddies(["a", "a", "b", "b"])
    assert plan.buddy == (2, 3, 0, 1) and plan.refused is None


def test_buddies_prefer_another_leaf() -> None:
    hosts = ["a", "b", "c", "d"]
    plan = pick_buddies(hosts, {"a": "leaf1", "b": "leaf1", "c": "leaf2", "d": "leaf2"})
    assert plan.buddy == (2, 3, 0, 1)  # a shift of 1 would keep a's copy on its own leaf (b)


def test_a_buddy_on_the_same_node_is_refused_with_the_reason() -> None:
    plan = pick_buddies(["a", "a"])
    assert plan.buddy == (None, None)
    assert plan.refused is not None and "same node dies with it" in plan.refused


# -- the holder process -------------------------------------------------------------------------
@pytest.fixture
def holder(tmp_path: Path) -> Iterator[HolderClient]:
    directory = Path("/tmp") / f"air-hpc-test-{os.getpid()}-{time.monotonic_ns()}"  # short: a socket path
    proc = subprocess.Popen([sys.executable, "-m", "air_hpc.runtime.snapholder", str(directory), "n1"])
    client = HolderClient(socket_path(directory, "n1"))
    try:
        yield client
    finally:
        client.close()
        proc.terminate()
        proc.wait(timeout=10)
        assert not socket_path(directory, "n1").exists()


def test_holder_keeps_the_two_newest_steps_per_owner(holder: HolderClient) -> None:
    for step in (1, 2, 3):
        holder.put(0, step, {"step": step}, [b"x" * step])
    holder.put(1, 1, {}, [b"y"])
    assert sorted((i["owner"], i["step"]) for i in holder.listing()) == [(0, 2), (0, 3), (1, 1)]
    assert holder.get(0, 3) == bytearray(b"xxx")
    assert holder.held_bytes() == 6
    with pytest.raises(HolderError, match="not held"):
        holder.get(0, 1)
    assert oct(os.stat(holder.path.parent).st_mode & 0o777) == "0o700"


def test_a_missing_holder_is_an_error_after_the_wait(tmp_path: Path) -> None:
    with pytest.raises(HolderError):
        HolderClient(tmp_path / "none.sock", connect_timeout_s=0.2).listing()


# -- snapshots through a holder (one rank, no process group) ------------------------------------
def test_restore_takes_the_newest_good_snapshot_and_reports_a_bad_one(holder: HolderClient, tmp_path: Path) -> None:
    events = EventLog(tmp_path / "events.jsonl")
    snaps = MemorySnapshots(1, LAYOUT, ["n1"], holder, events)
    training = _state()
    for step in (1, 2):
        _train(training, 1)
        snaps.after_step(step, training.at(consumed_samples=8 * step))
    snaps.wait()
    expected = _train(training, 2)
    good = holder.get(0, 1)
    bad = bytearray(holder.get(0, 2))
    bad[-40] ^= 1
    holder.put(0, 2, {**SnapshotInfo(0, 2, 1, LAYOUT).to_json()}, [bytes(bad)])

    other = _state(seed=3)
    loaded = snaps.restore(other, newest_checkpoint=None)
    assert loaded is not None and loaded.step == 1 and loaded.extra == {"consumed_samples": 8}
    _train(other, 1)  # the step the bad snapshot held, redone
    assert _train(other, 2) == expected
    kinds = [(e["kind"], e.get("step")) for e in read_events(tmp_path / "events.jsonl")]
    assert ("snapshot_skipped", 2) in kinds and ("memory_resume", 1) in kinds
    assert ("snapshot_buddies", None) in kinds
    assert good == holder.get(0, 1)
    snaps.close()


def test_a_newer_checkpoint_wins_over_older_snapshots(holder: HolderClient) -> None:
    snaps = MemorySnapshots(2, LAYOUT, ["n1"], holder, None)
    training = _state()
    for step in (1, 2, 3):
        snaps.after_step(step, training.at(consumed_samples=step))  # only step 2 is due
    snaps.wait()
    assert [i["step"] for i in holder.listing()] == [2]
    assert snaps.restore(_state(), newest_checkpoint=3) is None
    assert snaps.restore(_state(), newest_checkpoint=2) is not None
    snaps.close()


def test_holder_refuses_a_memfd_that_is_not_sealed_or_not_the_size_said(holder: HolderClient) -> None:
    fd, size = sealed_memfd([b"abc", b"de"])
    with pytest.raises(OSError):
        os.pwrite(fd, b"x", 0)  # sealed: not even its writer can change a put blob
    holder.put_memfd(0, 1, {}, fd, size)
    assert holder.get(0, 1) == bytearray(b"abcde")
    unsealed = os.memfd_create("test")
    os.write(unsealed, b"abc")
    with pytest.raises(HolderError, match="not sealed"):
        holder.put_memfd(0, 2, {}, unsealed, 3)
    fd, _ = sealed_memfd([b"abc"])
    with pytest.raises(HolderError, match="3 bytes, the request says 4"):
        holder.put_memfd(0, 2, {}, fd, 4)
    assert [i["step"] for i in holder.listing()] == [1]
