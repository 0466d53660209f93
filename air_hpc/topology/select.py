"""Which nodes a job should get: the lowest common switch, then the fewest spines, then the fewest leaves.

The choice is lexicographically optimal, in this order:

1. the lowest switch that holds ``count`` free nodes (a single leaf if one is
   big enough), like Slurm's topology/tree best fit;
2. below it, the fewest *spines* (the switches directly above the chosen
   leaves): traffic that crosses the top of the tree is the most expensive;
3. among sets on that many spines, the fewest leaves;
4. then the tightest fit: each leaf is swapped for a smaller one of the chosen
   spines while the total still covers ``count``, so bigger free leaves stay
   whole for the next big job; among tops, the one with the fewest free nodes.

Steps 2-3 are a small dynamic program (:func:`_fewest_spines_then_leaves`):
a spine that contributes ``g`` leaves contributes at most its ``g`` fullest
free leaves, so ``best[j][g]`` = the most free nodes reachable with ``j`` spines
and ``g`` leaves is a knapsack over spines; the answer is the fewest spines
(greedy on their free totals, which is exact) and then the smallest ``g`` with
``best[spines][g] >= count``. Bounded by the greedy solution's leaf count, it
stays well under a second at 100k nodes.

Everything is deterministic: ties break on the fabric's switch order.
"""

import bisect
import logging
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from air_hpc.errors import TopologyError
from air_hpc.slurm import hostlist
from air_hpc.topology.fabric import Fabric

log = logging.getLogger(__name__)

#: "no selection reaches this (spines, leaves) state": negative even after adding every node of a fabric
_UNREACHABLE = -(1 << 40)


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
    options = []
    for name in (c for c in candidates if fabric.switches[c].level == lowest):
        picked = _pick_leaves(fabric, name, free_under, count, order)
        spines = len({fabric.switches[leaf].parent for leaf in picked}) if len(picked) > 1 else 0
        options.append(((spines, len(picked), free_under[name], order[name]), name, picked))
    _, top, leaves = min(options)

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
        nodelist=hostlist.compress(nodes),
        leaves=tuple(leaves),
        switches_by_level=tuple(len(level) for level in used),
        lower_bound_leaves=lower_bound,
        switches_hint=len(leaves),
        top_switch=top,
    )


def _pick_leaves(
    fabric: Fabric, top: str, free_under: Mapping[str, int], count: int, order: Mapping[str, int]
) -> list[str]:
    """Leaves under ``top``: the fewest spines, then the fewest leaves, fitting ``count`` tightly."""
    if fabric.switches[top].is_leaf:
        return [top]
    groups: dict[str, list[str]] = {}
    for leaf in fabric.leaves_under[top]:
        if free_under[leaf] > 0:
            groups.setdefault(fabric.switches[leaf].parent or leaf, []).append(leaf)
    for members in groups.values():
        members.sort(key=lambda leaf: (-free_under[leaf], order[leaf]))
    chosen = _fewest_spines_then_leaves(groups, free_under, count)
    pool = [leaf for spine in {fabric.switches[leaf].parent or leaf for leaf in chosen} for leaf in groups[spine]]
    chosen = _tighten(chosen, [leaf for leaf in pool if leaf not in set(chosen)], free_under, count, order)
    return sorted(chosen, key=lambda leaf: order[leaf])


def _fewest_spines_then_leaves(
    groups: Mapping[str, Sequence[str]], free_under: Mapping[str, int], count: int
) -> list[str]:
    """The exact (spines, leaves) optimum over spine groups whose leaves are sorted fullest first (module doc)."""
    names = sorted(groups, key=lambda g: -sum(free_under[leaf] for leaf in groups[g]))
    totals = [sum(free_under[leaf] for leaf in groups[g]) for g in names]
    spines = min_leaves(totals, count)
    # an upper bound on leaves: the fullest leaves of the fullest `spines` groups
    bound = min_leaves(sorted((free_under[lf] for g in names[:spines] for lf in groups[g]), reverse=True), count)
    # spines with the same free leaf counts are interchangeable: more than `spines` of one kind never help
    seen: dict[tuple[int, ...], int] = {}
    kept = []
    for name in names:
        profile = tuple(free_under[leaf] for leaf in groups[name][:bound])
        seen[profile] = seen.get(profile, 0) + 1
        if seen[profile] <= spines:
            kept.append(name)
    names = kept
    prefix = [np.cumsum([0] + [free_under[leaf] for leaf in groups[g][:bound]]) for g in names]
    best = np.full((spines + 1, bound + 1), _UNREACHABLE, dtype=np.int64)
    best[0, 0] = 0
    history = []
    for gains in prefix:
        most = len(gains) - 1
        # window c of the padded row covers best[., c - most .. c]; its entry w means taking most - w leaves here
        padded = np.concatenate([np.full((spines, most), _UNREACHABLE, dtype=np.int64), best[:-1]], axis=1)
        windows = sliding_window_view(padded, most + 1, axis=1)[:, :, :most]
        step = best.copy()
        np.maximum(step[1:], (windows + gains[most:0:-1]).max(axis=2), out=step[1:])
        history.append(best)
        best = step
    leaves_needed = int(np.argmax(best[spines] >= count))
    # walk back: which spine gave how many leaves
    chosen: list[str] = []
    j, g = spines, leaves_needed
    for index in range(len(names) - 1, -1, -1):
        before, gains = history[index], prefix[index]
        value = best[j, g]
        if before[j, g] == value:
            best = before
            continue
        taken = next(
            k
            for k in range(1, min(g, len(gains) - 1) + 1)
            if before[j - 1, g - k] >= 0 and before[j - 1, g - k] + gains[k] == value
        )
        chosen.extend(groups[names[index]][:taken])
        j, g, best = j - 1, g - taken, before
    return chosen


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


def nvlink_block(fabric: Fabric, node: str, domain_nodes: int) -> tuple[str, int]:
    """The NVLink domain of ``node``: runs of ``domain_nodes`` nodes along its leaf (as placement cuts them)."""
    leaf = fabric.leaf_of[node]
    return leaf, fabric.switches[leaf].nodes.index(node) // domain_nodes


def _nearness(fabric: Fabric, target: str, candidate: str, domain_nodes: int) -> tuple[int, int, int]:
    same_block = domain_nodes > 1 and nvlink_block(fabric, target, domain_nodes) == nvlink_block(
        fabric, candidate, domain_nodes
    )
    return (0 if same_block else 1, fabric.common_level(target, candidate), fabric.node_index[candidate])


def select_spares(fabric: Fabric, chosen: Sequence[str], available: Set[str], count: int) -> tuple[str, ...]:
    """``count`` hot spares for a job on ``chosen``: free nodes nearest to it (its leaves first), in switch order."""
    if count < 1:
        return ()
    pool = [n for n in fabric.nodes if n in available and n not in set(chosen)]
    if len(pool) < count:
        raise TopologyError(
            f"{fabric.source or 'fabric'}: {count} spare node(s) requested beside {len(chosen)} but only "
            f"{len(pool)} more are available"
        )
    ranked = sorted(pool, key=lambda n: (min(fabric.common_level(c, n) for c in chosen), fabric.node_index[n]))
    return tuple(sorted(ranked[:count], key=fabric.node_index.__getitem__))


def pick_spare(fabric: Fabric | None, failed: str, spares: Sequence[str], domain_nodes: int = 1) -> str:
    """The spare to take ``failed``'s place: same NVLink block, then same leaf, then the lowest common switch.

    Without a fabric (or for nodes it does not know) the first spare in the given order.
    """
    if not spares:
        raise TopologyError(f"no spare node left to replace {failed}")
    known = fabric is not None and failed in fabric.leaf_of and all(s in fabric.leaf_of for s in spares)
    if fabric is None or not known:
        return spares[0]
    return min(spares, key=lambda s: _nearness(fabric, failed, s, domain_nodes))
