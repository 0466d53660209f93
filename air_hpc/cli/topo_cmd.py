"""``air-hpc topo``: import a fabric, look at it, and pick nodes from it."""

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.tree import Tree

from air_hpc.cli.options import echo_json, json_option, slurm_client
from air_hpc.errors import InputError, TopologyError
from air_hpc.slurm import hostlist
from air_hpc.slurm.nodes import fetch_node_states
from air_hpc.topology import block_build, files, topoyaml, treeconf
from air_hpc.topology.block_build import BuiltBlocks
from air_hpc.topology.block_select import select_blocks
from air_hpc.topology.blocks import BlockModel
from air_hpc.topology.fabric import Fabric
from air_hpc.topology.ibnetdiscover import import_ibnetdiscover
from air_hpc.topology.select import select_nodes

log = logging.getLogger(__name__)


@click.group()
def topo() -> None:
    """Import, inspect and select from the cluster's network topology."""


def _read(path: str, what: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise InputError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None


@topo.command("import")
@click.option(
    "--ibnetdiscover",
    "capture",
    metavar="FILE",
    help="ibnetdiscover output (default or -p); optional for --format block with --nvlink-csv.",
)
@click.option("--nodes", metavar="HOSTLIST", help="Compute nodes to keep, e.g. dgx-[001-128]; others are reported.")
@click.option("--node-pattern", metavar="REGEX", help="Keep only hosts whose name fully matches REGEX.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["tree", "block", "yaml"]),
    default="tree",
    show_default=True,
    help="topology.conf as a switch tree or as blocks, or a topology.yaml (Slurm 25.05) with both.",
)
@click.option(
    "--nvlink-csv",
    metavar="FILE",
    help="'hostname, fabric.clusterUuid, fabric.cliqueId' rows: one block per NVLink domain "
    "(without it blocks fall back to IB leaf switches).",
)
@click.option("--block-sizes", metavar="N,2N,...", help="BlockSizes to write (default: the domain size doubled).")
@click.option("-o", "--output", metavar="FILE", help="Write here instead of stdout.")
def import_(
    capture: str | None,
    nodes: str | None,
    node_pattern: str | None,
    fmt: str,
    nvlink_csv: str | None,
    block_sizes: str | None,
    output: str | None,
) -> None:
    """Turn an ibnetdiscover capture and/or NVLink domains into a topology file Slurm accepts; skips on stderr."""
    if capture is None and nvlink_csv is None:
        raise InputError("topo import: give --ibnetdiscover FILE, --nvlink-csv FILE (block or yaml), or both")
    sizes = _block_sizes(block_sizes) if block_sizes is not None else None
    wanted = hostlist.expand(nodes, "--nodes") if nodes is not None else None
    fabric = None
    if capture is not None:
        result = import_ibnetdiscover(_read(capture, "--ibnetdiscover"), capture, wanted, node_pattern)
        fabric = result.fabric
        for line in result.skipped:
            click.echo(f"skipped: {line}", err=True)
        for line in result.notes:
            log.info("%s", line)
    blocks = None
    if fmt != "tree" and (nvlink_csv is not None or fmt == "block"):
        built = _blocks(fabric, nvlink_csv, wanted, sizes)
        for line in built.skipped:
            click.echo(f"skipped: {line}", err=True)
        blocks = built.topology
    sources = " and ".join(Path(p).name for p in (capture, nvlink_csv) if p is not None)
    header = f"written by air-hpc from {sources}"
    if fmt == "yaml":
        text = f"# topology.yaml {header}\n" + topoyaml.render(fabric, blocks)
    elif blocks is not None:
        text = f"# topology.conf {header}\n" + treeconf.render_block(blocks)
    elif fabric is None:
        raise InputError("topo import --format tree needs --ibnetdiscover FILE (a tree comes from the IB fabric)")
    else:
        text = treeconf.render(fabric, header=f"topology.conf {header}")
    if output:
        Path(output).write_text(text)
    else:
        click.echo(text, nl=False)
    parts = []
    if fabric is not None:
        parts.append(
            f"imported {len(fabric.nodes)} compute nodes, {len(fabric.leaves)} leaf switch(es), "
            f"{fabric.height} level(s)"
        )
    if blocks is not None:
        parts.append(f"{len(blocks.blocks)} block(s), BlockSizes={','.join(map(str, blocks.block_sizes))}")
    click.echo("; ".join(parts), err=True)


def _block_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise InputError(f"--block-sizes={text!r}: expected comma-separated node counts, e.g. 18,36,72") from None
    treeconf.check_block_sizes(sizes, "--block-sizes")
    return sizes


def _blocks(
    fabric: Fabric | None, nvlink_csv: str | None, wanted: list[str] | None, sizes: tuple[int, ...] | None
) -> BuiltBlocks:
    """Blocks from NVLink domains (ordered by the fabric when there is one), else from IB leaves with a warning."""
    if nvlink_csv is None:
        if fabric is None:
            raise InputError("topo import: blocks need --nvlink-csv FILE or --ibnetdiscover FILE (IB leaves)")
        click.echo(
            "warning: no --nvlink-csv: one block per IB leaf switch; NVLink domains are unknown, so blocks may "
            "not match them",
            err=True,
        )
        return block_build.blocks_from_leaves(fabric, sizes)
    domains = block_build.read_nvlink_csv(_read(nvlink_csv, "--nvlink-csv"), nvlink_csv)
    keep = set(fabric.nodes) if fabric is not None else set(wanted) if wanted is not None else set(domains)
    outside = sorted(set(domains) - keep)
    if outside:
        what = "not compute nodes" if fabric is not None else "not in --nodes"
        click.echo(f"skipped: {hostlist.compress(outside)}: in {nvlink_csv} but {what}", err=True)
    no_domain = sorted(keep - set(domains))
    if no_domain:
        click.echo(f"skipped: {hostlist.compress(no_domain)}: in no NVLink domain", err=True)
    if fabric is None:
        click.echo("note: no --ibnetdiscover: blocks ordered by hostname, not by IB leaf", err=True)
    return block_build.blocks_from_domains({n: d for n, d in domains.items() if n in keep}, nvlink_csv, sizes, fabric)


def _unavailable(unavailable: str | None, unavailable_file: str | None) -> set[str]:
    names: set[str] = set()
    if unavailable:
        names.update(hostlist.expand(unavailable, "--unavailable"))
    if unavailable_file:
        for number, line in enumerate(_read(unavailable_file, "--unavailable-file").splitlines(), start=1):
            expr = line.split("#", 1)[0].strip()
            if expr:
                names.update(hostlist.expand(expr, f"{unavailable_file}:{number}"))
    return names


def _available(fabric_nodes: tuple[str, ...], unavailable: set[str], from_slurm: bool) -> set[str]:
    available = set(fabric_nodes) - unavailable
    if from_slurm:
        states = fetch_node_states(slurm_client())
        unknown = set(fabric_nodes) - states.all_nodes
        if unknown:
            log.warning("%d topology node(s) unknown to Slurm, treated as unavailable", len(unknown))
        available &= states.available
    return available


unavailable_options = [
    click.option("--unavailable", metavar="HOSTLIST", help="Nodes to treat as busy, e.g. n[3-5],n9."),
    click.option("--unavailable-file", metavar="FILE", help="File of hostlists (one per line, # comments)."),
    click.option("--from-slurm", is_flag=True, help="Also take live node state from the controller (scontrol)."),
]


def _with_unavailable(func: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(unavailable_options):
        func = option(func)
    return func


@topo.command()
@click.argument("topology_file", metavar="FILE")
@_with_unavailable
def show(topology_file: str, unavailable: str | None, unavailable_file: str | None, from_slurm: bool) -> None:
    """Show the switch tree in FILE with free/used node counts."""
    fabric = files.read_any(_read(topology_file, "topology"), topology_file)
    free = _available(fabric.nodes, _unavailable(unavailable, unavailable_file), from_slurm)

    def label(name: str) -> str:
        switch = fabric.switches[name]
        members = [n for leaf in fabric.leaves_under[name] for n in fabric.switches[leaf].nodes]
        n_free = sum(1 for n in members if n in free)
        text = f"[bold]{name}[/] (level {switch.level})  free {n_free}/{len(members)}  used {len(members) - n_free}"
        if switch.is_leaf:
            used = [n for n in members if n not in free]
            text += f"  [green]{hostlist.compress(n for n in members if n in free) or '-'}[/]"
            if used:
                text += f"  used: [red]{hostlist.compress(used)}[/]"
        return text

    console = Console(highlight=False)
    for root in fabric.roots:
        tree = Tree(label(root))
        stack = [(root, tree)]
        while stack:
            name, branch = stack.pop()
            for child in fabric.switches[name].children:
                stack.append((child, branch.add(label(child))))
        console.print(tree)


@topo.command("select")
@click.option("--topology", "topology_file", required=True, metavar="FILE", help="topology.conf (tree or block).")
@click.option("-N", "--nodes", "count", required=True, type=int, help="Number of nodes wanted.")
@click.option(
    "--segment",
    type=int,
    metavar="K",
    help="Block topologies: split the job into segments of K nodes, each inside one base block (sbatch --segment).",
)
@_with_unavailable
@json_option
def select_(
    topology_file: str,
    count: int,
    segment: int | None,
    unavailable: str | None,
    unavailable_file: str | None,
    from_slurm: bool,
    as_json: bool,
) -> None:
    """Pick COUNT free nodes: fewest switches on a tree, Slurm's block rules on a block topology."""
    topology = files.read_topology(_read(topology_file, "--topology"), topology_file)
    if isinstance(topology, Fabric):
        if segment is not None:
            raise TopologyError(
                f"{topology_file}: --segment needs a block topology (BlockName= lines); this file is a switch tree"
            )
        data = _select_tree(
            topology, _available(topology.nodes, _unavailable(unavailable, unavailable_file), from_slurm), count
        )
    else:
        model = BlockModel(topology)
        nodes = tuple(model.block_of)
        data = _select_block(
            model, _available(nodes, _unavailable(unavailable, unavailable_file), from_slurm), count, segment
        )
    if as_json:
        echo_json(data)
        return
    click.echo(f"nodelist: {data['nodelist']}")
    if "blocks" in data:
        click.echo(
            f"blocks: {len(data['blocks'])} ({', '.join(data['blocks'])}) inside an aggregate of "
            f"{data['aggregate_nodes']} nodes; {data['whole_blocks_broken']} wholly free block(s) broken"
        )
        if data["segment"]:
            click.echo(f"segments: {', '.join(data['segments'])}")
    else:
        click.echo(
            f"leaf switches: {data['leaf_switches']} ({', '.join(data['leaves'])}); "
            f"lower bound {data['lower_bound_leaves']}"
        )
        click.echo(f"switches per level (leaf first): {data['switches_by_level']} under {data['top_switch']}")
    click.echo(f"sbatch: {' '.join(data['sbatch'])}")


def _select_tree(fabric: Fabric, available: set[str], count: int) -> dict[str, Any]:
    sel = select_nodes(fabric, available, count)
    return {
        "plugin": "topology/tree",
        "nodelist": sel.nodelist,
        "nodes": list(sel.nodes),
        "leaf_switches": len(sel.leaves),
        "leaves": list(sel.leaves),
        "switches_by_level": list(sel.switches_by_level),
        "lower_bound_leaves": sel.lower_bound_leaves,
        "switches_hint": sel.switches_hint,
        "top_switch": sel.top_switch,
        "sbatch": [f"--nodes={count}", f"--nodelist={sel.nodelist}", f"--switches={sel.switches_hint}"],
    }


def _select_block(model: BlockModel, available: set[str], count: int, segment: int | None) -> dict[str, Any]:
    sel = select_blocks(model, available, count, segment)
    return {
        "plugin": "topology/block",
        "nodelist": sel.nodelist,
        "nodes": list(sel.nodes),
        "blocks": list(sel.blocks),
        "segment": sel.segment,
        "segments": [hostlist.compress(s) for s in sel.segments],
        "aggregate": list(sel.aggregate),
        "aggregate_nodes": sel.aggregate_nodes,
        "whole_blocks_broken": sel.whole_blocks_broken,
        "sbatch": list(sel.sbatch_options),
    }
