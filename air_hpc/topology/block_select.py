"""Which nodes a job should get on a block topology (NVLink domains under Slurm's topology/block).

Only sets Slurm accepts are returned (:func:`air_hpc.topology.blocks.violation`
is None for each). Among those, lexicographically:

1. the smallest aligned aggregate holding the whole set (level 0: one base
   block). Blocks adjacent in the file sit under the same IB leaves (our writer
   orders them so), so a smaller aggregate keeps inter-domain traffic under
   fewer switches; and Slurm itself confines the job to one aggregate, so this
   only refines its rule;
2. the fewest base blocks: every block boundary is a drop from NVLink to
   InfiniBand bandwidth, which costs the job more than where the set lies;
3. the fewest wholly free blocks broken: a whole free block is what the next
   job asking for a full domain (or ``--segment`` equal to the block) needs,
   and fragments of already used blocks serve this job just as well;
4. the aggregate with the fewest free nodes (Slurm's own best fit), then file
   order.

Each step is exact: for a given aggregate the fewest blocks are the fullest
ones; for a given count of whole blocks taken, the fullest whole and partial
blocks maximise the nodes reached. Where Slurm also limits how many
next-level-down aggregates a job may touch (levels missing from BlockSizes),
the admissible sub-aggregates are enumerated (or, past a few hundred
combinations, the fullest are taken).
"""

import bisect
import itertools
import logging
from collections.abc import Sequence, Set
from dataclasses import dataclass

from air_hpc.errors import TopologyError
from air_hpc.slurm import hostlist
from air_hpc.topology.blocks import BlockModel, aggregate_level, violation

log = logging.getLogger(__name__)

#: most sub-aggregate combinations tried exactly before taking the fullest
_MAX_COMBINATIONS = 256


@dataclass(frozen=True)
class BlockSelection:
    """The nodes chosen for one job on a block topology, and the sbatch options that pin them."""

    #: chosen nodes, block by block in file order
    nodes: tuple[str, ...]
    #: compressed, sorted hostlist for ``--nodelist``
    nodelist: str
    #: base blocks used, in file order
    blocks: tuple[str, ...]
    #: the job's segments, each inside one base block (the whole job is one segment without ``--segment``)
    segments: tuple[tuple[str, ...], ...]
    #: ``--segment`` value Slurm applies (None: no segmenting)
    segment: int | None
    #: blocks of the smallest aligned aggregate that holds the set, and its size in nodes
    aggregate: tuple[str, ...]
    aggregate_nodes: int
    #: wholly free blocks this selection takes nodes from
    whole_blocks_broken: int

    @property
    def sbatch_options(self) -> tuple[str, ...]:
        """What reproduces this choice under topology/block (``--switches`` means nothing there)."""
        opts = [f"--nodes={len(self.nodes)}", f"--nodelist={self.nodelist}"]
        if self.segment is not None:
            opts.append(f"--segment={self.segment}")
        return tuple(opts)


@dataclass(frozen=True)
class _Pick:
    blocks: tuple[int, ...]
    whole: int


def select_blocks(model: BlockModel, available: Set[str], count: int, segment: int | None = None) -> BlockSelection:
    """Choose ``count`` available nodes Slurm would accept; raise :class:`TopologyError` if none exist."""
    if count < 1:
        raise TopologyError(f"node count must be >= 1, got {count}")
    seg = model.check_segment(count, segment)
    blocks = model.topology.blocks
    free = [[n for n in b.nodes if n in available] for b in blocks]
    unit = seg or 1
    need = count // unit
    caps = [len(f) // unit for f in free]
    whole = [len(f) == len(b.nodes) for f, b in zip(free, blocks, strict=True)]
    where = model.topology.source or "block topology"
    if sum(caps) < need:
        what = f"{need} segments of {seg} nodes (each inside one block)" if seg else f"{count} nodes"
        raise TopologyError(
            f"{where}: {what} requested but the free nodes of {len(blocks)} blocks hold only "
            f"{sum(caps) * unit if seg else sum(caps)}"
        )
    shape = model.shape(count)
    last = model.top_level if seg or shape.level is None else shape.level
    for level in range(last + 1):
        best: tuple[tuple[int, int, int, int], _Pick] | None = None
        for group, start in enumerate(range(0, len(blocks), 1 << level)):
            members = range(start, min(len(blocks), start + (1 << level)))
            limit = None if seg or level <= shape.lower_level else (shape.lower_level, shape.max_lower)
            pick = _pick_in(members, caps, whole, need, limit)
            if pick is None:
                continue
            key = (len(pick.blocks), pick.whole, sum(len(free[i]) for i in members), group)
            if best is None or key < best[0]:
                best = (key, pick)
        if best is not None:
            return _selection(model, free, best[1], count, seg)
    size = model.base_size << (model.top_level if shape.level is None else shape.level)
    raise TopologyError(
        f"{where}: no aggregate of {size} nodes has {count} free nodes that Slurm's block rules allow together; "
        "Slurm would make the job wait"
    )


def _pick_in(
    members: range, caps: Sequence[int], whole: Sequence[bool], need: int, limit: tuple[int, int] | None
) -> _Pick | None:
    """Fewest blocks of ``members``, then fewest whole ones, reaching ``need``; within ``limit`` sub-aggregates."""
    pick = _fewest(members, caps, whole, need)
    if pick is None or limit is None:
        return pick
    lower, most = limit
    if len({i >> lower for i in pick.blocks}) <= most:
        return pick
    subs: dict[int, list[int]] = {}
    for i in members:
        subs.setdefault(i >> lower, []).append(i)
    if len(subs) <= most:
        return pick
    combos: Sequence[Sequence[int]]
    if _binomial_at_most(len(subs), most, _MAX_COMBINATIONS):
        combos = list(itertools.combinations(sorted(subs), most))
    else:
        fullest = sorted(subs, key=lambda s: (-sum(caps[i] for i in subs[s]), s))[:most]
        combos = [sorted(fullest)]
    best: _Pick | None = None
    for combo in combos:
        candidate = _fewest([i for s in combo for i in subs[s]], caps, whole, need)
        if candidate is not None and (
            best is None or (len(candidate.blocks), candidate.whole) < (len(best.blocks), best.whole)
        ):
            best = candidate
    return best


def _binomial_at_most(n: int, k: int, limit: int) -> bool:
    value = 1
    for i in range(min(k, n - k)):
        value = value * (n - i) // (i + 1)
        if value > limit:
            return False
    return True


def _fewest(members: Sequence[int] | range, caps: Sequence[int], whole: Sequence[bool], need: int) -> _Pick | None:
    """The fewest blocks reaching ``need``; among those, the fewest wholly free ones (exact, see module doc)."""
    order = sorted((i for i in members if caps[i] > 0), key=lambda i: (-caps[i], i))
    running = list(itertools.accumulate(caps[i] for i in order))
    m = bisect.bisect_left(running, need) + 1
    if m > len(order):
        return None
    wholes = [i for i in order if whole[i]]
    parts = [i for i in order if not whole[i]]
    for w in range(min(m, len(wholes)) + 1):
        if m - w > len(parts):
            continue
        chosen = wholes[:w] + parts[: m - w]
        if sum(caps[i] for i in chosen) >= need:
            return _Pick(blocks=tuple(sorted(chosen)), whole=w)
    raise AssertionError("unreachable: the fullest m blocks reach need")  # pragma: no cover


def _selection(
    model: BlockModel, free: Sequence[Sequence[str]], pick: _Pick, count: int, seg: int | None
) -> BlockSelection:
    """Fill the chosen blocks smallest first, so the one left partly free is the fullest."""
    unit = seg or 1
    remaining = count // unit
    taken: dict[int, list[str]] = {}
    for i in sorted(pick.blocks, key=lambda i: (len(free[i]), i)):
        units = min(len(free[i]) // unit, remaining)
        taken[i] = list(free[i][: units * unit])
        remaining -= units
    order = sorted(taken)
    nodes = tuple(n for i in order for n in taken[i])
    if seg is None:
        segments: tuple[tuple[str, ...], ...] = (nodes,)
    else:
        segments = tuple(tuple(taken[i][k : k + seg]) for i in order for k in range(0, len(taken[i]), seg))
    level = aggregate_level(order)
    start = order[0] >> level << level
    names = model.names
    selection = BlockSelection(
        nodes=nodes,
        nodelist=hostlist.compress(nodes),
        blocks=tuple(names[i] for i in order),
        segments=segments,
        segment=seg,
        aggregate=tuple(names[start : start + (1 << level)]),
        aggregate_nodes=model.base_size << level,
        whole_blocks_broken=pick.whole,
    )
    reason = violation(model, nodes, seg)
    if reason is not None:  # a bug here would make Slurm refuse the job: stop before submitting
        raise TopologyError(f"internal error: block selection broke Slurm's rules ({reason})")
    log.debug("selected %d nodes in %d block(s) %s", count, len(order), ",".join(selection.blocks))
    return selection
