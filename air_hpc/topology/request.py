"""Which nodes to ask Slurm for, given the fabric, the nodes free now and the run's bad nodes.

Selection (:mod:`~air_hpc.topology.select`, :mod:`~air_hpc.topology.block_select`)
answers "which nodes are best"; this module turns the job's wishes (node count,
hot spares, pinning, segments) into a :class:`NodeRequest`, falling back to a
request Slurm can wait on when too few nodes are free now. It never runs Slurm:
the caller passes the live node state in (:mod:`air_hpc.launch.plan` fetches it).
"""

from collections.abc import Collection, Set
from dataclasses import dataclass

from air_hpc.config.models import JobConfig
from air_hpc.errors import ConfigError, TopologyError
from air_hpc.slurm import hostlist as hostlists
from air_hpc.topology.block_select import select_blocks
from air_hpc.topology.block_spares import SparedSelection, select_with_spares
from air_hpc.topology.blocks import BlockModel
from air_hpc.topology.fabric import Fabric
from air_hpc.topology.place import place, place_selection
from air_hpc.topology.select import select_nodes, select_spares
from air_hpc.topology.treeconf import BlockTopology

Notes = tuple[str, ...]


@dataclass(frozen=True)
class NodeRequest:
    """Which nodes to ask Slurm for; made from a topology selection and placement."""

    nodelist: str | None = None
    """Hostlist expression pinned with ``--nodelist``."""
    switches: int | None = None
    """Leaf switches to ask for with ``--switches`` when nodes are not pinned."""
    segment: int | None = None
    """Nodes per segment under topology/block (``--segment``): each segment stays inside one base block."""
    rank_hosts: tuple[str, ...] = ()
    """One host per rank, in rank order (written to ``SLURM_HOSTFILE``); empty: Slurm's block order."""
    exclude: str | None = None
    """Hostlist expression to keep out of the allocation (``--exclude``), e.g. known bad nodes."""
    spares: tuple[str, ...] = ()
    """Hot spares pinned beside the rank hosts (part of ``nodelist``, no ranks until a node fails)."""


def _exclude(bad: Collection[str]) -> str | None:
    return hostlists.compress(bad) if bad else None


def count_only(bad: Collection[str], reason: str) -> tuple[NodeRequest, Notes]:
    """No topology to choose from: only the node count (and the bad nodes to avoid) goes to Slurm."""
    return NodeRequest(exclude=_exclude(bad)), (f"node count only: {reason}",)


def check_cluster_size(job: JobConfig, cluster_nodes: int, source: str) -> None:
    """The nodes plus the hot spares must fit in the cluster at all (a bad config, not a long wait)."""
    res = job.resources
    if res.spare_nodes and res.nodes + res.spare_nodes > cluster_nodes:
        raise ConfigError(
            f"resources.spare_nodes: {res.nodes} node(s) + {res.spare_nodes} spare(s) exceed the "
            f"{cluster_nodes} node(s) of the cluster ({source}); expected at most {max(cluster_nodes - res.nodes, 0)}"
        )


def request_nodes(
    job: JobConfig,
    topology: Fabric | BlockTopology,
    source: str,
    available: Set[str] | None,
    bad: Collection[str],
) -> tuple[NodeRequest, Notes]:
    """Pick nodes on the fewest switches (or inside blocks) from ``available`` minus ``bad``; say what was decided.

    ``available`` is the live node state (None: every node of ``topology`` counts
    as free); ``source`` names the topology file in messages.
    """
    if isinstance(topology, BlockTopology):
        return _block_request(job, topology, source, available, set(bad))
    return _tree_request(job, topology, source, available, set(bad))


def _tree_request(
    job: JobConfig, fabric: Fabric, source: str, available: Set[str] | None, bad: set[str]
) -> tuple[NodeRequest, Notes]:
    check_cluster_size(job, len(fabric.nodes), f"cluster.topology_file {source}")
    exclude = _exclude(bad)
    everything = set(fabric.nodes) - bad
    candidates = everything if available is None else set(available) - bad
    notes: list[str] = []
    try:
        selection = select_nodes(fabric, candidates, job.resources.nodes)
        if job.resources.spare_nodes:
            # The spares belong in the same switch tree: choose them together, then the nodes among them.
            group = select_nodes(fabric, candidates, job.resources.nodes + job.resources.spare_nodes)
            selection = select_nodes(fabric, set(group.nodes), job.resources.nodes)
    except TopologyError as exc:
        if candidates == everything:
            raise
        selection = select_nodes(fabric, everything, job.resources.nodes)
        notes.append(f"not enough free nodes now ({exc}); letting Slurm wait for --switches={selection.switches_hint}")
        return NodeRequest(switches=selection.switches_hint, exclude=exclude), tuple(notes)
    notes.append(
        f"selected {selection.nodelist} on {len(selection.leaves)} leaf switch(es) "
        f"(lower bound {selection.lower_bound_leaves})"
    )
    if not job.placement.pin_nodes:
        return NodeRequest(switches=selection.switches_hint, exclude=exclude), (
            *notes,
            f"not pinned: asking Slurm for --switches={selection.switches_hint}",
        )
    placement = place_selection(
        fabric, selection, job.layout, job.resources.tasks_per_node, job.hardware.nvlink_domain_nodes
    )
    if placement.fallback:
        notes.append(f"rank order: switch order ({placement.fallback})")
    spares = select_spares(fabric, selection.nodes, candidates, job.resources.spare_nodes)
    if spares:
        notes.append(f"hot spare(s) {hostlists.compress(spares)}")
    nodelist = hostlists.compress([*selection.nodes, *spares]) if spares else selection.nodelist
    return NodeRequest(nodelist=nodelist, rank_hosts=placement.ranks, exclude=exclude, spares=spares), tuple(notes)


def _block_request(
    job: JobConfig, topology: BlockTopology, source: str, available: Set[str] | None, bad: set[str]
) -> tuple[NodeRequest, Notes]:
    """Under topology/block: a set Slurm accepts, ``--segment`` (no ``--switches``), TP groups inside one block.

    The segment defaults to the nodes of one TP group, so every block holds whole
    TP groups and the NVLink domain map can keep each group inside its domain.
    Hot spares join the request under the same rules (:mod:`~air_hpc.topology.block_spares`).
    """
    exclude = _exclude(bad)
    model = BlockModel(topology)
    segment = job.placement.segment or _tp_nodes(job)
    check_block_spares(job, model, segment, source)
    everything = set(model.block_of) - bad
    candidates = everything if available is None else set(available) - bad
    try:
        picked = _choose_blocks(job, model, candidates, segment)
    except TopologyError as exc:
        if candidates == everything:
            raise
        waiting = _choose_blocks(job, model, everything, segment)
        return NodeRequest(segment=waiting.segment, exclude=exclude), (
            f"not enough free nodes now ({exc}); letting Slurm place the job under its block rules",
        )
    selection = picked.selection
    notes = [
        f"selected {selection.nodelist} in {len(selection.blocks)} block(s) ({','.join(selection.blocks)}) "
        f"inside an aggregate of {selection.aggregate_nodes} nodes"
    ]
    if picked.spares:
        where = ",".join(model.names[i] for i in sorted({model.block_of[n] for n in picked.spares}))
        notes.append(f"hot spare(s) {hostlists.compress(picked.spares)} in block(s) {where}")
    if not job.placement.pin_nodes:
        return NodeRequest(segment=picked.segment, exclude=exclude), (
            *notes,
            "not pinned: Slurm places the job under its block rules",
        )
    domains = {node: model.names[model.block_of[node]] for node in selection.nodes}
    placement = place(
        topology.to_fabric(),
        selection.nodes,
        job.layout,
        job.resources.tasks_per_node,
        job.hardware.nvlink_domain_nodes,
        nvlink_domains=domains,
    )
    if placement.fallback:
        notes.append(f"rank order: block order ({placement.fallback})")
    request = NodeRequest(
        nodelist=picked.nodelist,
        segment=picked.segment,
        rank_hosts=placement.ranks,
        exclude=exclude,
        spares=picked.spares,
    )
    return request, tuple(notes)


def _choose_blocks(job: JobConfig, model: BlockModel, available: Set[str], segment: int | None) -> SparedSelection:
    res = job.resources
    if res.spare_nodes:
        return select_with_spares(model, available, res.nodes, res.spare_nodes, segment)
    selection = select_blocks(model, available, res.nodes, segment)
    return SparedSelection(selection, (), selection.segment)


def check_block_spares(job: JobConfig, model: BlockModel, segment: int | None, source: str) -> None:
    """Spares the block layout can never hold (all nodes free) are a bad config, not a wait.

    Only the spares are blamed: when the job alone does not fit, selection says why.
    """
    res = job.resources
    if not res.spare_nodes:
        return
    check_cluster_size(job, len(model.block_of), f"cluster.topology_file {source}")
    every = set(model.block_of)
    try:
        select_blocks(model, every, res.nodes, segment)
    except TopologyError:
        return
    try:
        select_with_spares(model, every, res.nodes, res.spare_nodes, segment)
    except TopologyError as exc:
        raise ConfigError(
            f"resources.spare_nodes: {res.spare_nodes} spare(s) beside {res.nodes} node(s) do not fit the block "
            f"layout of {source}: {str(exc).removeprefix(f'{model.topology.source}: ')}"
        ) from None


def _tp_nodes(job: JobConfig) -> int | None:
    """Nodes one TP group spans when it spans several (None otherwise)."""
    tp, per_node = job.layout.tp, job.resources.tasks_per_node
    return tp // per_node if tp > per_node and tp % per_node == 0 else None
