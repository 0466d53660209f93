"""Which nodes to ask Slurm for, given the fabric, the nodes free now and the run's bad nodes.

Selection (:mod:`~air_hpc.topology.select`, :mod:`~air_hpc.topology.block_select`)
answers "which nodes are best"; this module turns the job's wishes (node count,
hot spares, pinning, segments) into a :class:`NodeRequest`, falling back to a
request Slurm can wait on when too few nodes are free now, and to one Slurm
places itself where the controller's release would refuse the pinned list
(:func:`~air_hpc.slurm.version.block_request_rules`). It never runs Slurm: the
caller passes the live node state and the release in (:mod:`air_hpc.launch.plan`
fetches them).
"""

from collections.abc import Collection, Sequence, Set
from dataclasses import dataclass

from air_hpc.config.models import JobConfig
from air_hpc.errors import ConfigError, TopologyError
from air_hpc.slurm import hostlist as hostlists
from air_hpc.slurm.version import BlockRequestRules, SlurmVersion, block_request_rules
from air_hpc.topology.block_select import select_blocks
from air_hpc.topology.block_spares import SparedSelection, select_with_spares
from air_hpc.topology.blocks import BlockModel, violation
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
    *,
    version: SlurmVersion | None = None,
    out_of_service: Collection[str] = (),
) -> tuple[NodeRequest, Notes]:
    """Pick nodes on the fewest switches (or inside blocks) from ``available`` minus ``bad``; say what was decided.

    ``available`` is the live node state (None: every node of ``topology`` counts
    as free); ``source`` names the topology file in messages. ``version`` is the
    controller's release (None: not known) and ``out_of_service`` its drained or
    down nodes: a block job Slurm places itself excludes them with the bad ones.
    """
    if isinstance(topology, BlockTopology):
        live = _Live(available, set(bad), frozenset(out_of_service), block_request_rules(version))
        return _block_request(job, topology, source, live)
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


@dataclass(frozen=True)
class _Live:
    """What a block request reads besides the job: the cluster's state now and its release's rules."""

    available: Set[str] | None
    bad: set[str]
    out_of_service: frozenset[str]
    rules: BlockRequestRules


def _block_request(job: JobConfig, topology: BlockTopology, source: str, live: _Live) -> tuple[NodeRequest, Notes]:
    """Under topology/block: a set Slurm accepts, ``--segment`` (no ``--switches``), TP groups inside one block.

    The segment defaults to the nodes of one TP group, so every block holds whole
    TP groups and the NVLink domain map can keep each group inside its domain.
    Hot spares join the request under the same rules (:mod:`~air_hpc.topology.block_spares`).
    Where the release would refuse the chosen list (:func:`unpinnable`), Slurm places the job.
    """
    exclude = _exclude(live.bad)
    model = BlockModel(topology)
    segment = job.placement.segment or _tp_nodes(job)
    if segment is not None and model.base_size < segment < job.resources.nodes + job.resources.spare_nodes:
        return _wide_segments(job, model, segment, source, live)
    check_block_spares(job, model, segment, source)
    everything = set(model.block_of) - live.bad
    candidates = everything if live.available is None else set(live.available) - live.bad
    try:
        picked = _choose_blocks(job, model, candidates, segment)
    except TopologyError as exc:
        if candidates == everything:
            raise
        waiting = _choose_blocks(job, model, everything, segment)
        return NodeRequest(segment=_segment_for(waiting.segment, live.rules), exclude=exclude), (
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
    segment_now = _segment_for(picked.segment, live.rules)
    if not job.placement.pin_nodes:
        return NodeRequest(segment=segment_now, exclude=exclude), (
            *notes,
            "not pinned: Slurm places the job under its block rules",
        )
    refused = unpinnable(model, (*selection.nodes, *picked.spares), segment_now, live.rules)
    if refused is not None:
        return _slurm_places(segment_now, live), (*notes, f"not pinned: {refused}; Slurm places the job")
    request, placed = _pinned_block_request(job, topology, picked, segment_now, exclude)
    return request, (*notes, *placed)


def _wide_segments(
    job: JobConfig, model: BlockModel, segment: int, source: str, live: _Live
) -> tuple[NodeRequest, Notes]:
    """Segments larger than a base block: refused before 25.11; from 25.11 Slurm places them, each in one aggregate.

    Selection here keeps a segment inside one base block, so it does not pin such a job:
    the request carries the count, the segment and the nodes to keep out, and the job reads
    the nodes Slurm chose back for its rank order, as where a release refuses a pinned list.
    """
    res = job.resources
    base = model.base_size
    if not live.rules.wide_segments:
        raise TopologyError(
            f"{source}: placement.segment={segment} is larger than the base block size {base}; {live.rules.release} "
            "cannot place it (each segment must fit in one base block; Slurm 25.11 and later accept wider ones)"
        )
    check_cluster_size(job, len(model.block_of), f"cluster.topology_file {source}")
    try:
        model.check_segment(res.nodes, segment, res.spare_nodes, wide=True)
    except TopologyError as exc:
        raise TopologyError(f"placement.segment: {exc}") from None
    level = model.shape(segment).level
    span = f"one aggregate of {1 << level} blocks" if level is not None else "the whole block topology"
    return _slurm_places(_segment_for(segment, live.rules), live), (
        f"--segment={segment} is wider than a base block ({base} nodes): {live.rules.release} keeps each "
        f"segment inside {span}; not pinned: Slurm places the segments",
    )


def unpinnable(model: BlockModel, nodes: Collection[str], segment: int | None, rules: BlockRequestRules) -> str | None:
    """Why the release would refuse ``--nodelist=nodes`` beside ``--segment=segment`` (None: it accepts it).

    25.05 refuses any required node list when the job has more than one segment;
    from 25.11 a list that covers the whole job is accepted. Without a segment the
    list must keep Slurm's shared-block rule (:func:`~air_hpc.topology.blocks.violation`).
    """
    if segment is not None and len(nodes) > segment and not rules.pinned_segments:
        return (
            f"{rules.release} refuses a node list beside --segment={segment} "
            "(slurmctld: requires nodes with segment are not supported; accepted from 25.11)"
        )
    return violation(model, nodes, segment)


def _segment_for(segment: int | None, rules: BlockRequestRules) -> int | None:
    """The ``--segment`` to send: none where the release has no such option (before 24.05)."""
    return segment if rules.segments else None


def _slurm_places(segment: int | None, live: _Live) -> NodeRequest:
    """No node list: Slurm places the segments; the bad and out-of-service nodes are kept out by name.

    The spares are whole segments of the count (``--nodes`` holds them); the job reads
    the nodes Slurm chose back for its rank order (:func:`place_in_allocation`).
    """
    return NodeRequest(segment=segment, exclude=_exclude(live.bad | live.out_of_service))


def _pinned_block_request(
    job: JobConfig, topology: BlockTopology, picked: SparedSelection, segment: int | None, exclude: str | None
) -> tuple[NodeRequest, Notes]:
    """The chosen nodes pinned, with the rank order that keeps each TP group inside one block (NVLink domain)."""
    model = BlockModel(topology)
    selection = picked.selection
    domains = {node: model.names[model.block_of[node]] for node in selection.nodes}
    placement = place(
        topology.to_fabric(),
        selection.nodes,
        job.layout,
        job.resources.tasks_per_node,
        job.hardware.nvlink_domain_nodes,
        nvlink_domains=domains,
    )
    notes = (f"rank order: block order ({placement.fallback})",) if placement.fallback else ()
    request = NodeRequest(
        nodelist=picked.nodelist,
        segment=segment,
        rank_hosts=placement.ranks,
        exclude=exclude,
        spares=picked.spares,
    )
    return request, notes


def place_in_allocation(
    job: JobConfig, topology: BlockTopology, allocated: Sequence[str], bad: Collection[str]
) -> tuple[str, ...] | None:
    """The rank order on the nodes Slurm chose (a request it placed itself): TP groups inside one block.

    The ranks take ``resources.nodes`` healthy allocated nodes in whole segments
    per block, the fewest blocks first (the rest are the spares); None when the
    allocation holds no such set (then the caller keeps Slurm's order).
    """
    model = BlockModel(topology)
    healthy = {n for n in allocated if n not in set(bad) and n in model.block_of}
    try:
        chosen = select_blocks(model, healthy, job.resources.nodes, job.placement.segment or _tp_nodes(job))
    except TopologyError:
        return None
    domains = {node: model.names[model.block_of[node]] for node in chosen.nodes}
    placement = place(
        topology.to_fabric(),
        chosen.nodes,
        job.layout,
        job.resources.tasks_per_node,
        job.hardware.nvlink_domain_nodes,
        nvlink_domains=domains,
    )
    return placement.ranks


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
