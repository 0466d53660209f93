"""Slurm's topology.conf: the tree form (``SwitchName=``) and the block form (``BlockName=``/``BlockSizes=``).

Readers are strict: an unknown key, a malformed pair, an empty hostlist or a
bad range stops with one error naming the file and line, because a silently
half-read topology makes Slurm (and our selection) place jobs badly without
anyone noticing. Writers emit hostlists compressed and sorted.
"""

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from air_hpc.errors import TopologyError
from air_hpc.slurm import hostlist
from air_hpc.topology.fabric import Fabric, SwitchSpec, build_fabric

_TREE_KEYS = {"switchname", "switches", "nodes", "linkspeed"}
_BLOCK_KEYS = {"blockname", "nodes", "blocksizes"}
_PAIR = re.compile(r"^([A-Za-z]+)=(\S+)$")


def _logical_lines(text: str) -> Iterator[tuple[int, str, str]]:
    """(first line number, content without comment, the comment) for each non-blank line; joins ``\\`` continuations."""
    pending = ""
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        content, _, comment = raw.partition("#")
        content = content.rstrip()
        if not pending:
            start = number
        if content.endswith("\\"):
            pending += content[:-1] + " "
            continue
        full = (pending + content).strip()
        pending = ""
        if full or comment.strip():
            yield start, full, comment.strip()
    if pending.strip():
        yield start, pending.strip(), ""


def _pairs(content: str, where: str, allowed: set[str]) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for token in content.split():
        match = _PAIR.match(token)
        if not match:
            raise TopologyError(f"{where}: cannot parse {token!r}; expected Key=Value pairs")
        key, value = match.group(1).lower(), match.group(2)
        if key not in allowed:
            raise TopologyError(f"{where}: unknown key {match.group(1)!r}; expected one of {sorted(allowed)}")
        if key in pairs:
            raise TopologyError(f"{where}: key {match.group(1)!r} given twice")
        pairs[key] = value
    return pairs


def parse(text: str, source_name: str) -> Fabric:
    """Read a tree topology.conf into a checked :class:`Fabric`."""
    specs: list[SwitchSpec] = []
    pending_comments: list[str] = []
    for line, content, comment in _logical_lines(text):
        where = f"{source_name}:{line}"
        if not content:
            pending_comments.append(comment)
            continue
        pairs = _pairs(content, where, _TREE_KEYS | _BLOCK_KEYS)
        if "blockname" in pairs or "blocksizes" in pairs:
            raise TopologyError(f"{where}: block topology line in a tree topology.conf; read it as a block file")
        if "switchname" not in pairs:
            raise TopologyError(f"{where}: no SwitchName=; expected 'SwitchName=NAME Nodes=...' or '... Switches=...'")
        nodes = tuple(hostlist.expand(pairs["nodes"], where)) if "nodes" in pairs else ()
        children = tuple(hostlist.expand(pairs["switches"], where)) if "switches" in pairs else ()
        specs.append(
            SwitchSpec(
                name=pairs["switchname"],
                children=children,
                nodes=nodes,
                comment="\n".join(c for c in [*pending_comments, comment] if c),
                line=line,
            )
        )
        pending_comments = []
    if not specs:
        raise TopologyError(f"{source_name}: no switches defined; expected lines like 'SwitchName=leaf1 Nodes=n[1-4]'")
    return build_fabric(specs, source_name)


def is_block_text(text: str) -> bool:
    """Whether a topology.conf is the block form (``BlockName=`` lines) rather than a switch tree."""
    return re.search(r"^\s*BlockName=", text, re.IGNORECASE | re.MULTILINE) is not None


def render(fabric: Fabric, header: str = "") -> str:
    """topology.conf text: leaves first, then each level up; each switch's comment above its line."""
    lines = [f"# {h}" if h else "#" for h in header.splitlines()]
    by_level = sorted(fabric.switch_order, key=lambda name: fabric.switches[name].level)
    for name in by_level:
        switch = fabric.switches[name]
        lines.extend(f"# {c}" for c in switch.comment.splitlines())
        if switch.is_leaf:
            lines.append(f"SwitchName={name} Nodes={hostlist.compress(switch.nodes)}")
        else:
            lines.append(f"SwitchName={name} Switches={hostlist.compress(switch.children)}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Block:
    name: str
    nodes: tuple[str, ...]
    comment: str = ""
    #: line in the source file, for error messages
    line: int | None = field(default=None, compare=False)


@dataclass(frozen=True)
class BlockTopology:
    """Slurm's topology/block: NVLink domains (blocks) and the block sizes jobs may be packed into."""

    blocks: tuple[Block, ...]
    #: ``BlockSizes=`` as written (empty: Slurm's default, see :mod:`air_hpc.topology.blocks`)
    block_sizes: tuple[int, ...] = ()
    source: str = ""
    #: line of ``BlockSizes=``, for error messages
    sizes_line: int | None = field(default=None, compare=False)

    def to_fabric(self) -> Fabric:
        """Blocks as leaves under one switch: for display and rank placement (selection follows Slurm's block rules)."""
        specs = [SwitchSpec(name=b.name, nodes=b.nodes, comment=b.comment) for b in self.blocks]
        if len(specs) > 1:
            specs.append(SwitchSpec(name="blocks", children=tuple(b.name for b in self.blocks)))
        return build_fabric(specs, self.source or "block topology")


def parse_block(text: str, source_name: str) -> BlockTopology:
    """Read a topology/block topology.conf (``BlockName=`` lines and an optional ``BlockSizes=``)."""
    blocks: list[Block] = []
    sizes: tuple[int, ...] = ()
    sizes_line: int | None = None
    for line, content, comment in _logical_lines(text):
        where = f"{source_name}:{line}"
        if not content:
            continue
        pairs = _pairs(content, where, _BLOCK_KEYS | _TREE_KEYS)
        if "switchname" in pairs:
            raise TopologyError(f"{where}: SwitchName= line in a block topology.conf; read it as a tree file")
        if "blocksizes" in pairs:
            if len(pairs) != 1 or sizes:
                raise TopologyError(f"{where}: BlockSizes= must stand alone on one line, once per file")
            sizes = _block_sizes(pairs["blocksizes"], where)
            sizes_line = line
            continue
        if "blockname" not in pairs or "nodes" not in pairs:
            raise TopologyError(f"{where}: expected 'BlockName=NAME Nodes=HOSTLIST'")
        nodes = tuple(hostlist.expand(pairs["nodes"], where))
        blocks.append(Block(name=pairs["blockname"], nodes=nodes, comment=comment, line=line))
    return block_topology(blocks, sizes, source_name, sizes_line)


def block_topology(
    blocks: Sequence[Block], sizes: tuple[int, ...], source_name: str, sizes_line: int | None = None
) -> BlockTopology:
    """Check what every block source must satisfy: unique names, each node in one block, the base size."""
    if not blocks:
        raise TopologyError(f"{source_name}: no blocks defined; expected lines like 'BlockName=b1 Nodes=n[1-18]'")
    owner: dict[str, str] = {}
    names: set[str] = set()
    for block in blocks:
        where = f"{source_name}:{block.line}" if block.line is not None else source_name
        if block.name in names:
            raise TopologyError(f"{where}: block {block.name!r} defined twice")
        names.add(block.name)
        for node in block.nodes:
            if node in owner:
                raise TopologyError(f"{where}: node {node!r} is in both block {owner[node]!r} and {block.name!r}")
            owner[node] = block.name
    topology = BlockTopology(blocks=tuple(blocks), block_sizes=sizes, source=source_name, sizes_line=sizes_line)
    check_base_size(topology)
    return topology


#: Slurm keeps at most 16 aggregation levels (base x 2^0 .. base x 2^15)
MAX_BLOCK_LEVEL = 15


def _block_sizes(value: str, where: str) -> tuple[int, ...]:
    try:
        if not re.fullmatch(r"[0-9]{1,9}(,[0-9]{1,9})*", value):
            raise ValueError(value)
        sizes = tuple(int(v) for v in value.split(","))
    except ValueError:
        raise TopologyError(f"{where}: BlockSizes={value!r} must be a comma-separated list of node counts") from None
    check_block_sizes(sizes, where)
    return sizes


def check_block_sizes(sizes: Sequence[int], where: str) -> None:
    """Slurm's rule: the first size is the base block; every other is base x 2^k (k <= 15), increasing.

    slurmctld stops with ``fatal: Invalid BlockSizes value`` otherwise, so we stop first.
    """
    text = ",".join(str(s) for s in sizes)
    if not sizes or any(s < 1 for s in sizes) or list(sizes) != sorted(set(sizes)):
        raise TopologyError(f"{where}: BlockSizes={text} must be positive node counts, strictly increasing")
    base = sizes[0]
    for size in sizes[1:]:
        ratio = size // base
        if size % base or ratio & (ratio - 1) or ratio.bit_length() - 1 > MAX_BLOCK_LEVEL:
            raise TopologyError(
                f"{where}: BlockSizes={text}: {size} is not the base block size {base} times a power of two "
                f"(at most 2^{MAX_BLOCK_LEVEL}); Slurm stops with 'Invalid BlockSizes value'"
            )


def check_base_size(topology: "BlockTopology") -> None:
    """Every block must hold at least the base block size (topology.yaml(5)); Slurm cannot use a shorter one."""
    base = topology.block_sizes[0] if topology.block_sizes else len(topology.blocks[0].nodes)
    for block in topology.blocks:
        if len(block.nodes) < base:
            where = f"{topology.source}:{block.line}" if block.line is not None else topology.source
            raise TopologyError(
                f"{where}: block {block.name!r} has {len(block.nodes)} node(s), fewer than the base block size "
                f"{base}; Slurm cannot use it (lower the first BlockSizes value or leave the block out)"
            )


def render_block(topology: BlockTopology) -> str:
    lines: list[str] = []
    for block in topology.blocks:
        lines.extend(f"# {c}" for c in block.comment.splitlines())
        lines.append(f"BlockName={block.name} Nodes={hostlist.compress(block.nodes)}")
    if topology.block_sizes:
        lines.append("BlockSizes=" + ",".join(str(s) for s in topology.block_sizes))
    return "\n".join(lines) + "\n"
