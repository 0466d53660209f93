"""Which nodes hold the job back: a node whose ranks are consistently busier per step than the rest.

Input: every rank's busy seconds for each step of a window (:mod:`air_hpc.health.busy`) and
each rank's node. A rank's time is its median over the window, so one slow step (a checkpoint
snapshot, a page fault) is not enough; it must be slow in most steps of the window. A node's
time is that of its slowest rank. A node is a straggler when its time is more than ``ratio``
times the median of the *other* nodes' times: comparing with the others, not with a median
that includes the node itself, keeps one slow node of two detectable. One node alone has
nothing to compare with and is never a straggler.
"""

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

#: Busy times below this (seconds per step) are too small to compare (timer granularity).
MIN_REFERENCE_S = 1e-3


@dataclass(frozen=True)
class Straggler:
    node: str
    ranks: tuple[int, ...]
    """The node's ranks that were slower than ``ratio`` times the reference."""
    busy_s: float
    """The node's time per step: its slowest rank's median over the window."""
    reference_s: float
    """The median time per step of the other nodes."""

    @property
    def ratio(self) -> float:
        return self.busy_s / self.reference_s

    def describe(self) -> str:
        ranks = ",".join(str(r) for r in self.ranks)
        return (
            f"{self.node} (rank(s) {ranks}) busy {self.busy_s * 1e3:.1f} ms per step, "
            f"{self.ratio:.1f}x the other nodes' {self.reference_s * 1e3:.1f} ms"
        )


def find_stragglers(
    busy_by_rank: Sequence[Sequence[float]], hosts: Sequence[str], ratio: float
) -> tuple[Straggler, ...]:
    """The straggler nodes of one window, slowest first; ``busy_by_rank[r]`` is rank r's seconds per step."""
    if len(busy_by_rank) != len(hosts):
        raise ValueError(f"{len(busy_by_rank)} ranks' step times but {len(hosts)} host names")
    per_rank = [statistics.median(times) if len(times) else 0.0 for times in busy_by_rank]
    per_node: dict[str, float] = {}
    for rank, host in enumerate(hosts):
        per_node[host] = max(per_node.get(host, 0.0), per_rank[rank])
    found = []
    for node, busy in per_node.items():
        others = [value for other, value in per_node.items() if other != node]
        if not others:
            continue
        reference = max(statistics.median(others), MIN_REFERENCE_S)
        if busy > ratio * reference:
            slow = tuple(r for r, host in enumerate(hosts) if host == node and per_rank[r] > ratio * reference)
            found.append(Straggler(node, slow, busy, reference))
    return tuple(sorted(found, key=lambda s: -s.ratio))
