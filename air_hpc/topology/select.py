"""Which nodes a job should get: the lowest common switch, the fewest switches below it, the tightest fit.

The choice, in order of priority:

1. the lowest switch that holds ``count`` free nodes (a single leaf if one is
   big enough), like Slurm's topology/tree best fit;
2. among switches at that level, the one needing the fewest child switches,
   then the fewest leaves, then the fewest free nodes (best fit keeps big free
   switches whole);
3. below it, the fewest child switches (spines under a core): traffic that
   crosses the top of the tree is the most expensive, and this is what keeps us
   at or below Slurm's spine count; among sets of that size, the one needing the
   fewest leaves;
4. within those, the fewest leaves (``k``) and among those the tightest: each
   leaf in the greedy pick is swapped for a smaller one while the total still
   covers ``count``, so bigger free leaves stay whole for the next big job.

Everything is deterministic: ties break on the fabric's switch order.
"""

import bisect
import logging
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

from air_hpc.errors import TopologyError
from air_hpc.topology import hostlists
from air_hpc.topology.fabric import Fabric

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeSelection:
    """The nodes chosen for one job, and the numbers to hand to Slurm."""

    #: chosen nodes in switch order (leaf by leaf), the order placement starts from
    nodes: tuple[str, ...]
    #: compressed, sorted hostlist for ``--nodelist``
    nodelist: str
    #: leaf switches used, in switch order
    leaves: tuple[str, ...]
    #: distinct switches used per level, leaf first, up to the lowest common switch (which counts 1);
    #: a level an unbalanced tree skips counts 0
    switches_by_level: tuple[int, ...]
    #: fewest leaves any selection could use, ignoring switch levels: ceil-style greedy over the fullest leaves
    lower_bound_leaves: int
    #: ``--switches=K`` for sbatch: the number of leaf switches this selection uses
    switches_hint: int
    #: the lowest switch joining every chosen node
    top_switch: str


def free_by_leaf(fabric: Fabric, available: Set[str]) -> dict[str, list[str]]:
    """Free nodes of every leaf, in the leaf's order; nodes outside the fabric are ignored."""
    return {leaf: [n for n in fabric.switches[leaf].nodes if n in available] for leaf in fabric.leaves}


def min_leaves(counts_desc: Sequence[int], count: int) -> int:
    """Fewest leaves (counts sorted descending) whose free nodes add up to ``count``; 0 if they cannot."""
    total = 0
    for used, c in enumerate(counts_desc, start=1):
        total += c
        if total >= count:
            return used
    return 0


def select_nodes(fabric: Fabric, available: Set[str], count: int) -> NodeSelection:
    """Choose ``count`` available nodes; raise :class:`TopologyError` if no single switch tree holds them."""
    if count < 1:
        raise TopologyError(f"node count must be >= 1, got {count}")
    free = free_by_leaf(fabric, available)
    total_free = sum(len(v) for v in free.values())
    if total_free < count:
        raise TopologyError(
            f"{fabric.source or 'fabric'}: {count} nodes requested but only {total_free} of "
            f"{len(fabric.nodes)} are available"
        )
    free_under: dict[str, int] = dict.fromkeys(fabric.switches, 0)
    for leaf, members in free.items():
        if members:
            for sw in fabric.ancestors(leaf):
                free_under[sw] += len(members)
    lower_bound = min_leaves(sorted((len(v) for v in free.values()), reverse=True), count)

    order = {name: i for i, name in enumerate(fabric.switch_order)}
    candidates = [name for name, n in free_under.items() if n >= count]
    if not candidates:
        raise TopologyError(
            f"{fabric.source or 'fabric'}: no switch tree has {count} free nodes (largest has "
            f"{max(free_under[r] for r in fabric.roots)}); Slurm cannot span separate fabrics"
        )
    lowest = min(fabric.switches[c].level for c in candidates)

    def rank(name: str) -> tuple[int, int, int, int]:
        children = sorted((free_under[c] for c in fabric.switches[name].children), reverse=True)
        leaves = sorted((len(free[leaf]) for leaf in fabric.leaves_under[name]), reverse=True)
        return (min_leaves(children, count), min_leaves(leaves, count), free_under[name], order[name])

    top = min((c for c in candidates if fabric.switches[c].level == lowest), key=rank)
    leaves = _pick_leaves(fabric, top, free_under, count, order)

    nodes: list[str] = []
    for leaf in leaves:
        nodes.extend(free[leaf][: count - len(nodes)])
    used: list[set[str]] = [set() for _ in range(fabric.switches[top].level + 1)]
    for leaf in leaves:
        for sw in fabric.ancestors(leaf):
            used[fabric.switches[sw].level].add(sw)
            if sw == top:
                break
    log.debug("selected %d nodes on %d leaves under %s", count, len(leaves), top)
    return NodeSelection(
        nodes=tuple(nodes),
        nodelist=hostlists.compress(nodes),
        leaves=tuple(leaves),
        switches_by_level=tuple(len(level) for level in used),
        lower_bound_leaves=lower_bound,
        switches_hint=len(leaves),
        top_switch=top,
    )


def _pick_leaves(
    fabric: Fabric, top: str, free_under: Mapping[str, int], count: int, order: Mapping[str, int]
) -> list[str]:
    """The fewest child switches of ``top``, then the fewest leaves below them, fitting ``count`` tightly."""
    if fabric.switches[top].is_leaf:
        return [top]
    children = [c for c in fabric.switches[top].children if free_under[c] > 0]
    if not all(fabric.switches[c].is_leaf for c in children):
        children = _fewest_children(fabric, children, free_under, count, order)
    pool = [leaf for c in children for leaf in fabric.leaves_under[c] if free_under[leaf] > 0]
    k = min_leaves(sorted((free_under[leaf] for leaf in pool), reverse=True), count)
    chosen = sorted(pool, key=lambda leaf: (-free_under[leaf], order[leaf]))[:k]
    chosen = _tighten(chosen, [leaf for leaf in pool if leaf not in set(chosen)], free_under, count, order)
    return sorted(chosen, key=lambda leaf: order[leaf])


def _fewest_children(
    fabric: Fabric, children: Sequence[str], free_under: Mapping[str, int], count: int, order: Mapping[str, int]
) -> list[str]:
    """The fewest children covering ``count``; of a few such sets, the one needing the fewest leaves.

    Candidates: the fullest children; that set tightened (smaller children swapped
    in while they still cover ``count``); and the children with the fullest leaves.
    """
    s = min_leaves(sorted((free_under[c] for c in children), reverse=True), count)
    leaf_counts = {
        c: sorted((free_under[leaf] for leaf in fabric.leaves_under[c] if free_under[leaf] > 0), reverse=True)
        for c in children
    }

    def leaves_needed(group: Sequence[str]) -> tuple[int, int]:
        counts = sorted((n for c in group for n in leaf_counts[c]), reverse=True)
        return (min_leaves(counts, count) or len(leaf_counts) * len(counts) + 1, sum(free_under[c] for c in group))

    greedy = sorted(children, key=lambda c: (-free_under[c], order[c]))[:s]
    tight = _tighten(greedy, [c for c in children if c not in set(greedy)], free_under, count, order)
    k_all = min_leaves(sorted((n for c in children for n in leaf_counts[c]), reverse=True), count)
    per_child = -(-k_all // s)
    by_leaves = sorted(children, key=lambda c: (-sum(leaf_counts[c][:per_child]), order[c]))[:s]
    best = min((tight, greedy, by_leaves), key=leaves_needed)
    return sorted(best, key=lambda c: order[c])


def _tighten(
    chosen: list[str], spare: list[str], free_count: Mapping[str, int], count: int, order: Mapping[str, int]
) -> list[str]:
    """Swap each chosen leaf, biggest first, for the smallest spare leaf that keeps the total >= count."""
    slack = sum(free_count[leaf] for leaf in chosen) - count
    spare_items = sorted((free_count[leaf], order[leaf], leaf) for leaf in spare)
    result = []
    for leaf in sorted(chosen, key=lambda x: (-free_count[x], order[x])):
        if slack > 0:
            i = bisect.bisect_left(spare_items, (max(free_count[leaf] - slack, 1), -1, ""))
            if i < len(spare_items) and spare_items[i][0] < free_count[leaf]:
                smaller, _, swap = spare_items.pop(i)
                slack -= free_count[leaf] - smaller
                bisect.insort(spare_items, (free_count[leaf], order[leaf], leaf))
                leaf = swap
        result.append(leaf)
    return result
