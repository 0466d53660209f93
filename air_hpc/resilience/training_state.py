"""One rank's training state as a checkpoint saves it and a resume loads into it: one typed bundle.

The checkpointer, the checkpoint format and the trainer pass this one value instead of four loose
arguments (model chunks, optimizer, scheduler, progress), as torchtitan's checkpoint manager keeps
one ``states`` dict. The protocols name exactly what the checkpoint code calls on each part, so a
Megatron object fits them as it is and a unit test's stand-in can be small.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol


class ModelChunk(Protocol):
    """One model chunk (a virtual pipeline stage), possibly inside Megatron's DDP wrapper."""

    def sharded_state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> Any: ...


class ShardedOptimizer(Protocol):
    """Megatron's optimizer: its state sharded like the model's (``MegatronOptimizer``)."""

    def sharded_state_dict(self, model_sharded_state_dict: dict[str, Any], is_loading: bool) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: Any) -> Any: ...


class Scheduler(Protocol):
    """The LR/WD schedule (``OptimizerParamScheduler``): plain state, saved as JSON."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> Any: ...


@dataclass(frozen=True)
class TrainingState:
    """What one rank saves and resumes: tensors (model, optimizer), the schedule, and progress counters.

    ``progress`` is saved beside the tensors (``air_hpc_state.json``'s ``extra``) and comes back as
    :attr:`~air_hpc.resilience.state.Loaded.extra`; a resume reads only the other three.
    """

    model_chunks: Sequence[ModelChunk]
    optimizer: ShardedOptimizer
    scheduler: Scheduler | None
    progress: Mapping[str, int] = field(default_factory=dict)

    def at(self, **progress: int) -> "TrainingState":
        """The same state with the progress of the step being saved (``consumed_samples=...``)."""
        return replace(self, progress=dict(progress))
