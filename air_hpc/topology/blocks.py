"""Slurm's topology/block rules: base blocks, aggregated blocks and segments, as slurmctld 25.05 applies them.

Behaviour followed: Slurm 25.05 (``select/cons_tres`` with ``topology/block``,
``eval_nodes_block.c``; topology.conf(5), topology.yaml(5), sbatch ``--segment``),
checked against a real 25.05 controller:

- Base blocks are the ``BlockName=`` lines in file order (index 0, 1, ...). The
  base block size is the first ``BlockSizes`` value (default: the first block's
  node count); every block holds at least that many nodes.
- ``BlockSizes`` enables aggregation levels: level k groups 2^k *adjacent*
  base blocks, aligned (blocks ``i`` and ``j`` share a level-k aggregate when
  ``i >> k == j >> k``). Without ``BlockSizes`` levels 0..3 are enabled.
- A job of N nodes needs ``ceil(N / base)`` base blocks, so level
  ``ceil(log2(that))``; it is placed inside one aggregate of the smallest
  *enabled* level at or above that (or anywhere, when N is bigger than every
  enabled size), and never moves up a level: if no such aggregate has room the
  job waits. Inside it, it may touch at most ``ceil(N / lower)`` aggregates of
  the next enabled level below (``lower`` nodes each).
- ``--segment=K`` (K < N) splits the job into N/K segments placed one by one,
  each inside one base block; N must be a multiple of K and K at most the base
  block size (a larger K is refused cluster-wide). Segments of one job need not
  share an aggregate.
- ``--switches`` has no effect; a ``--nodelist`` that breaks these rules is
  refused ("requires nodes that do not have shared block").

:func:`violation` says whether Slurm would accept a node set; selection
(:mod:`air_hpc.topology.block_select`) only returns sets it accepts.
"""

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType

from air_hpc.errors import TopologyError
from air_hpc.topology.fabric import Fabric, SwitchSpec, build_fabric
from air_hpc.topology.treeconf import BlockTopology

#: levels Slurm enables when topology.conf has no BlockSizes= (base x 1, 2, 4, 8)
DEFAULT_LEVELS = (0, 1, 2, 3)


@dataclass(frozen=True)
class JobShape:
    """Where Slurm lets one job (or one segment) go."""

    #: enabled aggregate level that must hold it (None: the whole system, bigger than every BlockSizes value)
    level: int | None
    #: the next enabled level below, whose aggregates the job may touch at most ``max_lower`` of
    lower_level: int
    max_lower: int


@dataclass(frozen=True)
class BlockModel:
    """A block topology with Slurm's numbers worked out once."""

    topology: BlockTopology

    @cached_property
    def base_size(self) -> int:
        sizes = self.topology.block_sizes
        return sizes[0] if sizes else len(self.topology.blocks[0].nodes)

    @cached_property
    def levels(self) -> tuple[int, ...]:
        """Enabled aggregation levels k (aggregates of 2^k base blocks), ascending; always starts at 0."""
        sizes = self.topology.block_sizes
        if not sizes:
            return DEFAULT_LEVELS
        return tuple((size // self.base_size).bit_length() - 1 for size in sizes)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.topology.blocks)

    @cached_property
    def block_of(self) -> Mapping[str, int]:
        """Index of the base block holding each node."""
        return MappingProxyType({node: i for i, block in enumerate(self.topology.blocks) for node in block.nodes})

    @cached_property
    def top_level(self) -> int:
        """The level whose single aggregate holds every block."""
        return max(0, (len(self.topology.blocks) - 1).bit_length())

    def shape(self, count: int) -> JobShape:
        """Slurm's level for ``count`` nodes (``_get_block_level`` in eval_nodes_block.c)."""
        need = -(-count // self.base_size)
        raw = (need - 1).bit_length()  # ceil(log2(need)), 0 for one block
        lower = max((k for k in self.levels if k <= raw - 1), default=0)
        level = next((k for k in self.levels if k >= raw), None)
        return JobShape(level=level, lower_level=lower, max_lower=-(-count // (self.base_size << lower)))

    def check_segment(self, count: int, segment: int | None, spares: int = 0, wide: bool = False) -> int | None:
        """The segment size Slurm will use for ``count`` nodes and ``spares`` beside them (None when it splits
        nothing); raises where Slurm would refuse it. The one place the segment rules live.

        ``wide``: the release places segments wider than a base block (25.11 on). Spares come in
        whole segments (Slurm sizes every segment alike, so a spare one stands in for a failed one).
        """
        total = count + spares
        if segment is None or segment >= total:
            return None  # Slurm ignores a segment as large as the job
        where = self.topology.source or "block topology"
        if segment < 1:
            raise TopologyError(f"--segment must be >= 1, got {segment}")
        if segment > self.base_size and not wide:
            raise TopologyError(
                f"{where}: --segment={segment} is larger than the base block size {self.base_size}; "
                "Slurm refuses it (each segment must fit in one base block)"
            )
        if spares and (count % segment or spares % segment):
            raise TopologyError(
                f"--segment={segment} (every segment, a spare one included, has the same size) must divide the "
                f"{spares} spare(s) as well as the {count} node(s); use a multiple of {segment}"
            )
        if total % segment:
            raise TopologyError(f"--segment={segment} does not divide the job's {total} nodes; Slurm refuses it")
        return segment


def aggregate_level(indices: Collection[int]) -> int:
    """Smallest k such that every block index lies in one aligned aggregate of 2^k blocks."""
    lo, hi = min(indices), max(indices)
    return (lo ^ hi).bit_length()


def violation(model: BlockModel, nodes: Collection[str], segment: int | None = None) -> str | None:
    """Why Slurm would refuse ``--nodelist=nodes -N len(nodes) [--segment]``; None when it accepts."""
    count = len(nodes)
    if count == 0 or len(set(nodes)) != count:
        return "the node set is empty or names a node twice"
    outside = [n for n in nodes if n not in model.block_of]
    if outside:
        return f"node {outside[0]!r} is in no block"
    try:
        seg = model.check_segment(count, segment)
    except TopologyError as exc:
        return str(exc)
    per_block: dict[int, int] = {}
    for node in nodes:
        per_block[model.block_of[node]] = per_block.get(model.block_of[node], 0) + 1
    if seg is not None:
        odd = [model.names[i] for i, n in sorted(per_block.items()) if n % seg]
        if odd:
            return f"block {odd[0]} holds a number of the job's nodes that is not a multiple of --segment={seg}"
        return None
    shape = model.shape(count)
    if shape.level is not None and len({i >> shape.level for i in per_block}) > 1:
        return (
            f"{count} nodes must share one aggregate of {model.base_size << shape.level} nodes "
            "(requires nodes that do not have shared block)"
        )
    lower = len({i >> shape.lower_level for i in per_block})
    if lower > shape.max_lower:
        return (
            f"{count} nodes may touch at most {shape.max_lower} aggregate(s) of "
            f"{model.base_size << shape.lower_level} nodes, this set touches {lower}"
        )
    return None


def aggregate_fabric(topology: BlockTopology) -> Fabric:
    """Blocks as leaves under one switch per aligned aggregate (level k over 2^k adjacent blocks).

    Nearness in this fabric is Slurm's: nodes of two blocks meet at the level of
    the smallest aggregate holding both, so tree choices made on it (the hot
    spare nearest a failed node) follow the block layout.
    """
    blocks = topology.blocks
    names = [b.name for b in blocks]

    def name(level: int, index: int) -> str:
        if level == 0:
            return names[index]
        first, last = index << level, min(len(names), (index + 1) << level) - 1
        return f"level{level}:{names[first]}..{names[last]}"

    specs = [SwitchSpec(name=b.name, nodes=b.nodes, comment=b.comment) for b in blocks]
    for level in range(1, BlockModel(topology).top_level + 1):
        for index in range(((len(names) - 1) >> level) + 1):
            below = (2 * index, 2 * index + 1)
            children = tuple(name(level - 1, c) for c in below if c << (level - 1) < len(names))
            specs.append(SwitchSpec(name=name(level, index), children=children))
    return build_fabric(specs, topology.source or "block topology")
