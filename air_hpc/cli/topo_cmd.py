"""``air-hpc topo``: import a fabric, look at it, and pick nodes from it."""

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from air_hpc.cli.options import echo_json, json_option

log = logging.getLogger(__name__)


@click.group()
def topo() -> None:
    """Import, inspect and select from the cluster's network topology."""


def _read(path: str, what: str) -> str:
    from air_hpc.errors import InputError

    try:
        return Path(path).read_text()
    except OSError as exc:
        raise InputError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None


@topo.command("import")
@click.option("--ibnetdiscover", "capture", required=True, metavar="FILE", help="ibnetdiscover output (default or -p).")
@click.option("--nodes", metavar="HOSTLIST", help="Compute nodes to keep, e.g. dgx-[001-128]; others are reported.")
@click.option("--node-pattern", metavar="REGEX", help="Keep only hosts whose name fully matches REGEX.")
@click.option("--format", "fmt", type=click.Choice(["tree", "block"]), default="tree", show_default=True)
@click.option(
    "--nvlink-csv",
    metavar="FILE",
    help="For --format block: 'hostname, fabric.clusterUuid, fabric.cliqueId' rows; one block per NVLink domain "
    "(default: one block per leaf).",
)
@click.option("-o", "--output", metavar="FILE", help="Write here instead of stdout.")
def import_(
    capture: str, nodes: str | None, node_pattern: str | None, fmt: str, nvlink_csv: str | None, output: str | None
) -> None:
    """Turn an ibnetdiscover capture into a topology.conf Slurm accepts; report what was left out on stderr."""
    from air_hpc.topology import hostlists, treeconf
    from air_hpc.topology.ibnetdiscover import import_ibnetdiscover

    wanted = hostlists.expand(nodes, "--nodes") if nodes is not None else None
    result = import_ibnetdiscover(_read(capture, "--ibnetdiscover"), capture, wanted, node_pattern)
    fabric = result.fabric
    for line in result.skipped:
        click.echo(f"skipped: {line}", err=True)
    for line in result.notes:
        log.info("%s", line)
    header = f"topology.conf written by air-hpc from {Path(capture).name}"
    if fmt == "tree":
        text = treeconf.render(fabric, header=header)
    else:
        if nvlink_csv is not None:
            domains = treeconf.read_nvlink_csv(_read(nvlink_csv, "--nvlink-csv"), nvlink_csv)
            outside = sorted(set(domains) - set(fabric.nodes))
            if outside:
                click.echo(f"skipped: {hostlists.compress(outside)}: in {nvlink_csv} but not compute nodes", err=True)
            no_domain = sorted(set(fabric.nodes) - set(domains))
            if no_domain:
                click.echo(f"skipped: {hostlists.compress(no_domain)}: in no NVLink domain", err=True)
            blocks = treeconf.blocks_from_domains({n: d for n, d in domains.items() if n in fabric.leaf_of}, nvlink_csv)
        else:
            blocks = treeconf.blocks_from_leaves(fabric)
        text = f"# {header}\n" + treeconf.render_block(blocks)
    if output:
        Path(output).write_text(text)
    else:
        click.echo(text, nl=False)
    click.echo(
        f"imported {len(fabric.nodes)} compute nodes, {len(fabric.leaves)} leaf switch(es), "
        f"{fabric.height} level(s); {len(result.skipped)} skip report(s)",
        err=True,
    )


def _unavailable(unavailable: str | None, unavailable_file: str | None) -> set[str]:
    from air_hpc.topology import hostlists

    names: set[str] = set()
    if unavailable:
        names.update(hostlists.expand(unavailable, "--unavailable"))
    if unavailable_file:
        for number, line in enumerate(_read(unavailable_file, "--unavailable-file").splitlines(), start=1):
            expr = line.split("#", 1)[0].strip()
            if expr:
                names.update(hostlists.expand(expr, f"{unavailable_file}:{number}"))
    return names


def _available(fabric_nodes: tuple[str, ...], unavailable: set[str], from_slurm: bool) -> set[str]:
    available = set(fabric_nodes) - unavailable
    if from_slurm:
        from air_hpc.slurm.client import SlurmClient
        from air_hpc.slurm.nodes import fetch_node_states

        states = fetch_node_states(SlurmClient())
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
    from rich.console import Console
    from rich.tree import Tree

    from air_hpc.topology import hostlists, treeconf

    fabric = treeconf.read_any(_read(topology_file, "topology"), topology_file)
    free = _available(fabric.nodes, _unavailable(unavailable, unavailable_file), from_slurm)

    def label(name: str) -> str:
        switch = fabric.switches[name]
        members = [n for leaf in fabric.leaves_under[name] for n in fabric.switches[leaf].nodes]
        n_free = sum(1 for n in members if n in free)
        text = f"[bold]{name}[/] (level {switch.level})  free {n_free}/{len(members)}  used {len(members) - n_free}"
        if switch.is_leaf:
            used = [n for n in members if n not in free]
            text += f"  [green]{hostlists.compress(n for n in members if n in free) or '-'}[/]"
            if used:
                text += f"  used: [red]{hostlists.compress(used)}[/]"
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
    from air_hpc.errors import TopologyError
    from air_hpc.topology import treeconf
    from air_hpc.topology.fabric import Fabric

    topology = treeconf.read_topology(_read(topology_file, "--topology"), topology_file)
    if isinstance(topology, Fabric):
        if segment is not None:
            raise TopologyError(
                f"{topology_file}: --segment needs a block topology (BlockName= lines); this file is a switch tree"
            )
        data = _select_tree(
            topology, _available(topology.nodes, _unavailable(unavailable, unavailable_file), from_slurm), count
        )
    else:
        from air_hpc.topology.blocks import BlockModel

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


def _select_tree(fabric: Any, available: set[str], count: int) -> dict[str, Any]:
    from air_hpc.topology.select import select_nodes

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


def _select_block(model: Any, available: set[str], count: int, segment: int | None) -> dict[str, Any]:
    from air_hpc.topology import hostlists
    from air_hpc.topology.block_select import select_blocks

    sel = select_blocks(model, available, count, segment)
    return {
        "plugin": "topology/block",
        "nodelist": sel.nodelist,
        "nodes": list(sel.nodes),
        "blocks": list(sel.blocks),
        "segment": sel.segment,
        "segments": [hostlists.compress(s) for s in sel.segments],
        "aggregate": list(sel.aggregate),
        "aggregate_nodes": sel.aggregate_nodes,
        "whole_blocks_broken": sel.whole_blocks_broken,
        "sbatch": list(sel.sbatch_options),
    }
