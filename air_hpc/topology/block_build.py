"""Block topologies from what a cluster reports: NVLink domains (nvidia-smi) or, failing that, IB leaves.

The base block size is what Slurm packs and segments by, so it must be the
domain's real size: with one tray missing from the CSV, the smallest domain
(17 of 18) would make ``BlockSizes=17,...`` and Slurm would then refuse
``--segment=18`` everywhere. The nominal size is therefore the most common
domain size; shorter domains are left out and reported (Slurm cannot use a
block smaller than the base size anyway). Blocks are ordered by their place in
the IB fabric when one is known, because Slurm aggregates *adjacent* blocks:
neighbours in the file should share leaf switches.
"""

import csv
import io
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from air_hpc.errors import InputError
from air_hpc.slurm import hostlist
from air_hpc.topology.fabric import Fabric
from air_hpc.topology.treeconf import Block, BlockTopology, check_block_sizes

#: nvidia-smi prints these for GPUs outside any NVLink fabric (no NVSwitch domain)
_NO_DOMAIN = {"", "n/a", "[n/a]", "00000000-0000-0000-0000-000000000000", "not supported", "[not supported]"}


@dataclass(frozen=True)
class BuiltBlocks:
    topology: BlockTopology
    #: one line per block left out, saying why
    skipped: tuple[str, ...] = ()


def read_nvlink_csv(text: str, source_name: str) -> dict[str, tuple[str, str]]:
    """Node -> (clusterUuid, cliqueId) from ``hostname, fabric.clusterUuid, fabric.cliqueId`` rows.

    One row per GPU or per node; a header row is allowed. Nodes whose GPUs are in
    no NVLink domain are left out. GPUs of one node that disagree are an error:
    the domain map would be ambiguous.
    """
    domains: dict[str, tuple[str, str]] = {}
    first_line: dict[str, int] = {}
    rows = csv.reader(io.StringIO(text, newline=""))
    any_row = False
    while True:
        try:
            row = next(rows)
        except StopIteration:
            break
        except csv.Error as exc:
            raise InputError(f"{source_name}:{rows.line_num}: not valid CSV ({exc})") from None
        number = rows.line_num
        cells = [c.strip() for c in row]
        if not cells or not any(cells) or cells[0].startswith("#"):
            continue
        where = f"{source_name}:{number}"
        if len(cells) != 3:
            raise InputError(f"{where}: expected 3 columns 'hostname, fabric.clusterUuid, fabric.cliqueId', got {row}")
        if not any_row and "clusteruuid" in cells[1].lower().replace(".", "").replace("_", ""):
            continue
        any_row = True
        node, uuid, clique = cells
        if uuid.lower() in _NO_DOMAIN or clique.lower() in _NO_DOMAIN:
            continue
        hostlist.expand(node, where)  # a node name Slurm can read back, nothing else
        domain = (uuid.lower(), clique)
        if node in domains and domains[node] != domain:
            raise InputError(
                f"{where}: node {node!r} has GPUs in two NVLink domains ({domains[node]} at line "
                f"{first_line[node]} and {domain})"
            )
        domains.setdefault(node, domain)
        first_line.setdefault(node, number)
    if not any_row:
        raise InputError(f"{source_name}: no rows; expected 'hostname, fabric.clusterUuid, fabric.cliqueId' per GPU")
    return domains


def blocks_from_domains(
    domain_of: Mapping[str, tuple[str, str]],
    source: str = "",
    block_sizes: Sequence[int] | None = None,
    fabric: Fabric | None = None,
) -> BuiltBlocks:
    """One block per NVLink domain, in IB order (``fabric``) or hostname order; BlockSizes from the nominal size."""
    members: dict[tuple[str, str], list[str]] = {}
    for node in hostlist.natural_sorted(domain_of):
        members.setdefault(domain_of[node], []).append(node)
    if not members:
        raise InputError(f"{source or 'NVLink map'}: no node is in an NVLink domain; nothing to write")
    comments = {
        tuple(nodes): f"NVLink domain clusterUuid={uuid} cliqueId={clique}" for (uuid, clique), nodes in members.items()
    }
    return _build(list(comments), comments, source, block_sizes, fabric, nominal=True)


def blocks_from_leaves(fabric: Fabric, block_sizes: Sequence[int] | None = None) -> BuiltBlocks:
    """One block per leaf switch: for fabrics where a leaf (or scalable unit) is the unit to pack."""
    groups = [fabric.switches[leaf].nodes for leaf in fabric.leaves]
    comments = {nodes: f"leaf switch {leaf}" for leaf, nodes in zip(fabric.leaves, groups, strict=True)}
    return _build(groups, comments, fabric.source, block_sizes, fabric, nominal=False)


def _build(
    groups: list[tuple[str, ...]],
    comments: Mapping[tuple[str, ...], str],
    source: str,
    block_sizes: Sequence[int] | None,
    fabric: Fabric | None,
    *,
    nominal: bool,
) -> BuiltBlocks:
    if block_sizes is not None:
        check_block_sizes(block_sizes, "--block-sizes")
        base = block_sizes[0]
    elif nominal:
        counts = Counter(len(g) for g in groups)
        base = max(counts, key=lambda size: (counts[size], size))
    else:
        base = min(len(g) for g in groups)
    kept = [g for g in groups if len(g) >= base]
    skipped = tuple(
        f"{hostlist.compress(g)}: {comments[g]} has {len(g)} node(s), fewer than the base block size {base}; "
        "left out (Slurm cannot use a block smaller than the first BlockSizes value)"
        for g in groups
        if len(g) < base
    )
    if not kept:
        raise InputError(f"{source or 'blocks'}: no block holds the base block size {base}; nothing to write")
    kept.sort(key=_ib_order(fabric, [n for g in groups for n in g]))
    blocks = tuple(Block(name=f"block{i}", nodes=g, comment=comments[g]) for i, g in enumerate(kept, start=1))
    sizes = tuple(block_sizes) if block_sizes is not None else default_block_sizes(base, len(blocks))
    return BuiltBlocks(BlockTopology(blocks=blocks, block_sizes=sizes, source=source), skipped)


def _ib_order(fabric: Fabric | None, nodes: Sequence[str]) -> Callable[[tuple[str, ...]], int]:
    """Sort key: a block's first position in the fabric's switch order (nodes under one leaf are adjacent there)."""
    position = dict(fabric.node_index) if fabric is not None else {}
    by_name = {n: i for i, n in enumerate(hostlist.natural_sorted(nodes))}
    offset = len(position)

    def key(group: tuple[str, ...]) -> int:
        return min(position.get(n, offset + by_name[n]) for n in group)

    return key


def default_block_sizes(base: int, count: int) -> tuple[int, ...]:
    """The base size doubled while that many nodes of blocks exist (as NVIDIA's topograph infers)."""
    sizes = [base]
    while sizes[-1] * 2 <= base * count:
        sizes.append(sizes[-1] * 2)
    return tuple(sizes)
