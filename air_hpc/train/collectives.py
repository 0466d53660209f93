"""Small collectives the trainer adds beside Megatron's: gathering a few numbers from every rank.

On NCCL the tensors live on the current GPU, on gloo on the CPU. Without an initialised
process group (a single process) a gather returns this rank's values alone.
"""

from collections.abc import Sequence


def gather_floats(values: Sequence[float]) -> list[list[float]]:
    """Every rank's ``values`` (the same length on all ranks), indexed by rank, on every rank."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [list(values)]
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    mine = torch.tensor(list(values), dtype=torch.float64, device=device)
    rows = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, mine)
    return [row.tolist() for row in rows]


def gather_strings(value: str) -> list[str]:
    """Every rank's ``value`` (a host name, say), indexed by rank, on every rank."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    out: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return [str(item) for item in out]
