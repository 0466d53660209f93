"""The few collectives air-hpc adds beside Megatron's, on the device the backend needs.

On NCCL a tensor must live on the current GPU, on gloo on the CPU: :func:`device` is the one
place that knows. Without an initialised process group (a single process) every collective
answers with this rank's own values.

:class:`Collectives` is what the :class:`~air_hpc.resilience.checkpointer.Checkpointer` needs
from the process group; it is passed in, so the checkpointer's async, wait, abandon and
supersede logic runs in unit tests against a fake (``tests/unit/checkpoint_fakes.py``).

Torch is imported on first use: ``runtime/__main__`` imports :mod:`air_hpc.resilience.signals`
(and so this module) to hold the stop signals before anything slow loads.
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch


def _initialised() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def device(group: Any = None) -> "torch.device":
    """Where a tensor for a collective on ``group`` must live: the current GPU on NCCL, else the CPU."""
    import torch
    import torch.distributed as dist

    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def max_int(value: int, group: Any = None) -> int:
    """The largest ``value`` over all ranks, on every rank: one MAX all-reduce of one int64."""
    if not _initialised():
        return value
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([value], dtype=torch.int64, device=device(group))
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return int(tensor.item())


def any_rank(flag: bool, group: Any = None) -> bool:
    """True on every rank if ``flag`` is true on any rank."""
    return bool(max_int(1 if flag else 0, group))


def gather_floats(values: Sequence[float]) -> list[list[float]]:
    """Every rank's ``values`` (the same length on all ranks), indexed by rank, on every rank."""
    if not _initialised():
        return [list(values)]
    import torch
    import torch.distributed as dist

    mine = torch.tensor(list(values), dtype=torch.float64, device=device())
    rows = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, mine)
    return [row.tolist() for row in rows]


def gather_strings(value: str) -> list[str]:
    """Every rank's ``value`` (a host name, say), indexed by rank, on every rank."""
    return [str(item) for item in gather_objects(value)]


def gather_objects(value: Any) -> list[Any]:
    """Every rank's picklable ``value``, indexed by rank, on every rank."""
    if not _initialised():
        return [value]
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


class Collectives(Protocol):
    """What the checkpointer asks of the process group; :class:`ProcessGroup` is the real one."""

    rank: int
    world_size: int

    def any_rank(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is true on any rank."""
        ...

    def barrier(self) -> None: ...

    def broadcast_from_0(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank."""
        ...

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, indexed by rank, on every rank."""
        ...


class ProcessGroup:
    """:class:`Collectives` over the default process group (or one process without it)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.rank = dist.get_rank() if _initialised() else 0
        self.world_size = dist.get_world_size() if _initialised() else 1

    def any_rank(self, flag: bool) -> bool:
        return any_rank(flag)

    def barrier(self) -> None:
        import torch.distributed as dist

        if _initialised():
            dist.barrier()

    def broadcast_from_0(self, value: Any) -> Any:
        import torch.distributed as dist

        if not _initialised():
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, value: Any) -> list[Any]:
        return gather_objects(value)
