"""Fakes for the Checkpointer's two seams: the process group and the checkpoint format.

:class:`FakeCollectives` is rank 0 of a job whose other ranks answer from a script, so a test
can say "another rank's writer has not reported yet" or "another rank found this checkpoint
corrupt" without starting a process group. :class:`FakeFormat` writes one small shard per save
in the (real, forked) writer; a gate file holds the writer back until the test opens it.
"""

import queue
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from air_hpc.config.layout import ParallelLayout
from air_hpc.errors import CheckpointError
from air_hpc.resilience.state import Loaded
from air_hpc.resilience.training_state import TrainingState


@dataclass
class FakeCollectives:
    """Rank 0 of ``world_size``; ``peers_any`` answers the next :meth:`any_rank` calls for the other ranks."""

    world_size: int = 2
    rank: int = 0
    peers_any: deque[bool] = field(default_factory=deque)
    peer_problems: deque[str | None] = field(default_factory=deque)
    calls: list[str] = field(default_factory=list)

    def any_rank(self, flag: bool) -> bool:
        self.calls.append("any_rank")
        return flag or (self.peers_any.popleft() if self.peers_any else False)

    def barrier(self) -> None:
        self.calls.append("barrier")

    def broadcast_from_0(self, value: Any) -> Any:
        self.calls.append("broadcast")
        return value

    def gather(self, value: Any) -> list[Any]:
        self.calls.append("gather")
        peer = self.peer_problems.popleft() if self.peer_problems else None
        return [value] + [peer] * (self.world_size - 1)


@dataclass(frozen=True)
class FakeRequest:
    directory: Path
    step: int


@dataclass
class FakeFormat:
    """Saves ``shard.bin`` (the step as text) per checkpoint; the writer waits for ``gate`` when set."""

    gate: Path | None = None
    fail_write: OSError | None = None
    results: "queue.Queue[Any]" = field(default_factory=queue.Queue)
    finalized: list[int] = field(default_factory=list)

    def plan(self, directory: Path, step: int, training: TrainingState, validate: bool) -> FakeRequest:
        return FakeRequest(directory, step)

    def stage(self, request: FakeRequest) -> FakeRequest:
        return request

    def writes(self, request: FakeRequest) -> bool:
        return True

    def write(self, request: FakeRequest, stage_to_host: bool, results: Any) -> None:
        while self.gate is not None and not self.gate.exists():
            time.sleep(0.01)
        if self.fail_write is not None:
            raise self.fail_write
        (request.directory / "shard.bin").write_text(str(request.step))
        results.put(f"wrote {request.step}")

    def shard_files(self, request: FakeRequest) -> list[Path]:
        return [request.directory / "shard.bin"]

    def results_queue(self) -> "queue.Queue[Any]":
        return self.results

    def finalize(self, request: FakeRequest) -> None:
        """Like Megatron's finalize: needs the write results on the queue."""
        assert self.results.get_nowait() == f"wrote {request.step}"
        self.finalized.append(request.step)

    def check(self, directory: Path) -> None:
        if not (directory / "shard.bin").is_file():
            raise CheckpointError(f"{directory}: no shard.bin")

    def load(self, directory: Path, training: TrainingState, reseed: Any) -> Loaded:
        step = int((directory / "shard.bin").read_text())
        layout = ParallelLayout(tp=1, pp=1, dp=2)
        return Loaded(step=step, extra={}, saved_layout=layout, layout_changed=False, rng_restored=True)


class UnreadOptimizer:
    """The optimizer of :data:`NO_STATE`: :class:`FakeFormat` never reads the training state."""

    def sharded_state_dict(self, model_sharded_state_dict: dict[str, Any], is_loading: bool) -> dict[str, Any]:
        raise AssertionError("the fake format read the optimizer")

    def load_state_dict(self, state_dict: Any) -> None:
        raise AssertionError("the fake format loaded the optimizer")


#: What the unit tests save and resume: nothing (the fake format writes the step as its shard).
NO_STATE = TrainingState((), UnreadOptimizer(), None)
