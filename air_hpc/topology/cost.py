"""Bytes each placement pushes through each switch level per training step.

A simple, explicit model, good for comparing two placements on the same fabric:

- DP: one ring all-reduce per (tp, pp) coordinate over the dp ranks in rank
  order (how NCCL orders inter-node ring steps); each rank sends
  ``2 (dp-1)/dp x dp_grad_bytes`` to the next rank of its ring.
- PP: for every pipeline (tp, dp coordinate), each adjacent stage pair exchanges
  ``pp_activation_bytes`` forward and the same backward per microbatch.

A message between two ranks passes every switch level up to the lowest switch
joining their nodes: same node -> no switch, same leaf -> level 0 only, leaves
under one spine -> levels 0 and 1, and so on.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from air_hpc.config.layout import ParallelLayout
from air_hpc.errors import ConfigError
from air_hpc.topology.fabric import Fabric


@dataclass(frozen=True)
class Traffic:
    """What one step moves: per-rank gradient bytes for DP, per-microbatch activation bytes for PP."""

    dp_grad_bytes: float
    pp_activation_bytes: float
    microbatches: int = 1

    @classmethod
    def for_gpt(
        cls,
        num_params: int,
        hidden_size: int,
        seq_length: int,
        micro_batch_size: int,
        microbatches: int,
        layout: ParallelLayout,
        grad_dtype_bytes: int = 4,
        activation_dtype_bytes: int = 2,
    ) -> "Traffic":
        """Gradients of one model-parallel shard; one microbatch's hidden states per PP send."""
        return cls(
            dp_grad_bytes=num_params * grad_dtype_bytes / (layout.tp * layout.pp),
            pp_activation_bytes=float(seq_length * micro_batch_size * hidden_size * activation_dtype_bytes),
            microbatches=microbatches,
        )


@dataclass(frozen=True)
class CostReport:
    #: DP all-reduce bytes that reach switch level i (index 0: leaves), summed over all ranks
    dp_bytes_by_level: tuple[float, ...]
    #: PP send/recv bytes that reach switch level i
    pp_bytes_by_level: tuple[float, ...]
    #: bytes that never leave a node (NVLink / shared memory)
    intra_node_bytes: float

    @property
    def total_by_level(self) -> tuple[float, ...]:
        return tuple(a + b for a, b in zip(self.dp_bytes_by_level, self.pp_bytes_by_level, strict=True))

    @property
    def above_leaf_bytes(self) -> float:
        """Bytes that climb above the leaves, once per level climbed: what placement can save."""
        return sum(self.total_by_level[1:])


def score(fabric: Fabric, ranks: Sequence[str], layout: ParallelLayout, traffic: Traffic) -> CostReport:
    """Bytes per switch level of one step for the rank -> host map ``ranks``."""
    if len(ranks) != layout.world_size:
        raise ConfigError(f"rank map has {len(ranks)} entries but the layout's world size is {layout.world_size}")
    height = fabric.height
    dp = [0.0] * height
    pp = [0.0] * height
    intra = 0.0
    memo: dict[tuple[str, str], int] = {}

    def level(a: str, b: str) -> int:
        key = (a, b) if a < b else (b, a)
        if key not in memo:
            memo[key] = fabric.common_level(a, b)
        return memo[key]

    tp_dp = layout.tp * layout.dp
    if layout.dp > 1:
        ring_bytes = 2 * (layout.dp - 1) / layout.dp * traffic.dp_grad_bytes
        for p in range(layout.pp):
            for t in range(layout.tp):
                ring = [ranks[t + layout.tp * d + tp_dp * p] for d in range(layout.dp)]
                for a, b in zip(ring, ring[1:] + ring[:1], strict=True):
                    lvl = level(a, b)
                    if lvl < 0:
                        intra += ring_bytes
                    for i in range(min(lvl + 1, height)):
                        dp[i] += ring_bytes
    pair_bytes = 2 * traffic.pp_activation_bytes * traffic.microbatches
    for p in range(layout.pp - 1):
        for r in range(tp_dp):
            lvl = level(ranks[r + tp_dp * p], ranks[r + tp_dp * (p + 1)])
            if lvl < 0:
                intra += pair_bytes
            for i in range(min(lvl + 1, height)):
                pp[i] += pair_bytes
    return CostReport(dp_bytes_by_level=tuple(dp), pp_bytes_by_level=tuple(pp), intra_node_bytes=intra)
