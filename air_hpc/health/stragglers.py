"""Which nodes hold the job back: a node whose ranks are consistently busier per step than the rest.

Input: every rank's busy seconds for each step of a window (:mod:`air_hpc.health.busy`) and
each rank's node. A rank's time is its median over the window, so one slow step (a checkpoint
snapshot, a page fault) is not enough; it must be slow in most steps of the window. A node's
time is that of its slowest rank. A node is a straggler when its time is more than ``ratio``
times the median of the *other* nodes' times: comparing with the others, not with a median
that includes the node itself, keeps one slow node of two detectable. One node alone has
nothing to compare with and is never a straggler.

The ratio alone flags clean runs on busy machines (a 30-step testbed run reported a 1.6x
straggler), so the node must also be slower than the others by a margin over the run's own
noise: ``noise_sigmas`` times the others' step-to-step spread (a robust standard deviation,
1.4826 x the median absolute deviation of each rank's times, the median over their ranks).
Persistence over several windows is the caller's (:mod:`air_hpc.train.straggler_watch`).
"""

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

#: Busy times below this (seconds per step) are too small to compare (timer granularity).
MIN_REFERENCE_S = 1e-3
#: A median absolute deviation times this estimates a standard deviation (for normal noise), robust to spikes.
MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class Straggler:
    node: str
    ranks: tuple[int, ...]
    """The node's ranks that were slower than ``ratio`` times the reference."""
    busy_s: float
    """The node's time per step: its slowest rank's median over the window."""
    reference_s: float
    """The median time per step of the other nodes."""
    noise_s: float = 0.0
    """The other nodes' step-to-step noise (robust standard deviation of a rank's times, their median)."""

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
    busy_by_rank: Sequence[Sequence[float]], hosts: Sequence[str], ratio: float, noise_sigmas: float = 0.0
) -> tuple[Straggler, ...]:
    """The straggler nodes of one window, slowest first; ``busy_by_rank[r]`` is rank r's seconds per step.

    A node is one when its time exceeds both ``ratio`` times the others' and the others' by ``noise_sigmas``
    times their noise.
    """
    if len(busy_by_rank) != len(hosts):
        raise ValueError(f"{len(busy_by_rank)} ranks' step times but {len(hosts)} host names")
    per_rank = [statistics.median(times) if len(times) else 0.0 for times in busy_by_rank]
    noise = [_robust_sigma(times) for times in busy_by_rank]
    per_node: dict[str, float] = {}
    for rank, host in enumerate(hosts):
        per_node[host] = max(per_node.get(host, 0.0), per_rank[rank])
    found = []
    for node, busy in per_node.items():
        others = [value for other, value in per_node.items() if other != node]
        if not others:
            continue
        reference = max(statistics.median(others), MIN_REFERENCE_S)
        spread = statistics.median(n for r, n in enumerate(noise) if hosts[r] != node)
        threshold = max(ratio * reference, reference + noise_sigmas * spread)
        if busy > threshold:
            slow = tuple(r for r, host in enumerate(hosts) if host == node and per_rank[r] > threshold)
            found.append(Straggler(node, slow, busy, reference, spread))
    return tuple(sorted(found, key=lambda s: -s.ratio))


def _robust_sigma(times: Sequence[float]) -> float:
    if len(times) < 2:
        return 0.0
    middle = statistics.median(times)
    return MAD_TO_SIGMA * statistics.median(abs(t - middle) for t in times)
