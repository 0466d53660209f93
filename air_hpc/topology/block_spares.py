"""Hot spares on a block topology: inside Slurm's block rules, in the job's own blocks first.

A job of N nodes with K spares asks Slurm for N+K nodes, so the spares obey
the same rules as the job (:mod:`air_hpc.topology.blocks`):

- with ``--segment=S`` every segment, a spare one included, stays inside one
  base block, so the spares come in whole segments (Slurm refuses an N+K that
  S does not divide). The segment must stay on the request: a requeue that
  swaps out a bad node lets Slurm pick the replacement, and only the segment
  rule keeps a TP group that spans S nodes inside one NVLink domain then;
- without a segment the whole set stays in one aggregate, like any job.

Inside those rules a spare goes where replacing a failed node hurts least: in
the block of the nodes it may replace (their NVLink domain, where the TP group
stays on NVLink), spread over the job's blocks so each gets one while there
are spares to give; then in the nearest block (the smallest aggregate it
shares with the job), partly used blocks before wholly free ones (those are
what the next job asking for a full domain needs). When that set breaks the
aggregate rules, the aggregate that holds N+K nodes best
(:func:`~air_hpc.topology.block_select.select_blocks`) is chosen first and the
job and its spares are placed inside it the same way; failing that, the job
takes the fewest blocks among those N+K nodes and the rest are spares.
"""

from collections.abc import Sequence, Set
from dataclasses import dataclass

from air_hpc.slurm import hostlist
from air_hpc.topology.block_select import BlockSelection, select_blocks
from air_hpc.topology.blocks import BlockModel, violation


@dataclass(frozen=True)
class SparedSelection:
    """The job's nodes, its hot spares, and the ``--segment`` that Slurm gets for all of them."""

    #: the nodes the ranks run on
    selection: BlockSelection
    #: spare nodes, in file order
    spares: tuple[str, ...]
    #: ``--segment`` for the whole allocation (None: no segmenting)
    segment: int | None

    @property
    def nodelist(self) -> str:
        """``--nodelist`` for the job and its spares."""
        return hostlist.compress([*self.selection.nodes, *self.spares])


def select_with_spares(
    model: BlockModel, available: Set[str], count: int, spares: int, segment: int | None = None
) -> SparedSelection:
    """``count`` nodes for the ranks and ``spares`` beside them that Slurm accepts together (module doc)."""
    seg = model.check_segment(count, segment, spares)
    job = select_blocks(model, available, count, segment)
    near = nearest_spares(model, job.nodes, available, spares, seg)
    if near is not None:
        return SparedSelection(job, near, seg)
    group = select_blocks(model, available, count + spares, segment)
    members = set(group.aggregate)
    inside = {n for b in model.topology.blocks if b.name in members for n in b.nodes if n in available}
    job = select_blocks(model, inside, count, segment)
    near = nearest_spares(model, job.nodes, inside, spares, seg)
    if near is not None:
        return SparedSelection(job, near, seg)
    job = select_blocks(model, set(group.nodes), count, segment)
    rest = tuple(n for n in group.nodes if n not in set(job.nodes))
    return SparedSelection(job, _file_order(model, rest), seg)


def nearest_spares(
    model: BlockModel, chosen: Sequence[str], available: Set[str], count: int, segment: int | None
) -> tuple[str, ...] | None:
    """``count`` free nodes beside ``chosen`` in whole segments, nearest first; None when Slurm would refuse the set.

    Nearest blocks are tried first; when that spreads the spares over more blocks than Slurm
    allows, blocks that hold all the spares still needed are tried first instead.
    """
    unit = segment or 1
    blocks = model.topology.blocks
    taken = set(chosen)
    free = [[n for n in b.nodes if n in available and n not in taken] for b in blocks]
    load: dict[int, int] = {}
    for node in chosen:
        load[model.block_of[node]] = load.get(model.block_of[node], 0) + 1
    home = sorted(load, key=lambda i: (-load[i], i))
    picked: list[str] = []
    while len(picked) < count and any(len(free[i]) >= unit for i in home):
        for i in home:
            if len(picked) < count and len(free[i]) >= unit:
                picked.extend(free[i][:unit])
                del free[i][:unit]
    rest = count - len(picked)
    others = sorted(
        (i for i in range(len(blocks)) if i not in load),
        key=lambda i: (min((i ^ h).bit_length() for h in home), len(free[i]) == len(blocks[i].nodes), i),
    )
    fitting = sorted(others, key=lambda i: len(free[i]) // unit * unit < rest)
    for order in (others, fitting):
        spread = _spill(free, order, rest, unit)
        if len(spread) == rest and violation(model, [*chosen, *picked, *spread], segment) is None:
            return _file_order(model, [*picked, *spread])
    return None


def _spill(free: Sequence[Sequence[str]], order: Sequence[int], count: int, unit: int) -> list[str]:
    """Up to ``count`` nodes from the blocks in ``order``, whole segments of ``unit`` at a time."""
    picked: list[str] = []
    for i in order:
        whole = min(len(free[i]) // unit, (count - len(picked)) // unit) * unit
        picked.extend(free[i][:whole])
    return picked


def _file_order(model: BlockModel, nodes: Sequence[str]) -> tuple[str, ...]:
    position = {node: i for i, node in enumerate(n for b in model.topology.blocks for n in b.nodes)}
    return tuple(sorted(nodes, key=position.__getitem__))
