"""Which rank runs where: an order of nodes that keeps Megatron's groups close on the fabric.

Rank order assumed: Megatron-core's default ``RankGenerator`` order
``"tp-cp-ep-dp-pp"`` (``megatron.core.parallel_state.initialize_model_parallel``),
with cp = ep = 1: tp varies fastest, then dp, then pp, so

    rank = tp_rank + tp * (dp_rank + dp * pp_rank)

and ranks fill nodes in blocks of ``tasks_per_node`` (node i holds ranks
``i*tasks_per_node ... (i+1)*tasks_per_node - 1``). Megatron's order is fixed, so
placement only chooses *which node* takes each block:

- a TP group spans ``ceil(tp / tasks_per_node)`` consecutive nodes (a *unit*); a
  unit is cut from one NVLink domain (a block of ``nvlink_domain_nodes`` nodes in
  switch order on one leaf, or the given domain map), so TP traffic never leaves it;
- the ``pp`` units that hold one pipeline (same tp/dp coordinates, every stage)
  form a *chain*, cut from one leaf where the leaf has room, so every PP
  send/recv stays below one leaf switch;
- chains are ordered by switch order, so each DP ring (one unit per chain, same
  stage) walks the fabric leaf by leaf instead of jumping back and forth.

Keeping pipelines on a leaf makes each DP ring span more leaves, so when the
caller gives the step's :class:`~air_hpc.topology.cost.Traffic`, the cost model
also scores whole stages in switch order (DP rings local, PP crossing) and
Slurm's default (sorted hostnames), and the cheapest wins. Without traffic
figures, pipelines on leaves is the rule.

The result is one hostname per rank, ready for ``SLURM_HOSTFILE`` with
``srun --distribution=arbitrary``.
"""

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from air_hpc.config.layout import ParallelLayout
from air_hpc.errors import ConfigError, TopologyError
from air_hpc.slurm import hostlist
from air_hpc.topology.cost import Traffic, score
from air_hpc.topology.fabric import Fabric
from air_hpc.topology.select import NodeSelection

log = logging.getLogger(__name__)

#: the Megatron-core rank order this module assumes (fastest first)
MEGATRON_ORDER = "tp-cp-ep-dp-pp"


@dataclass(frozen=True)
class Placement:
    #: the nodes in the order ranks fill them (node i takes ranks i*tasks_per_node...)
    node_order: tuple[str, ...]
    #: host of every global rank, ``len == layout.world_size``
    ranks: tuple[str, ...]
    tasks_per_node: int
    #: why placement fell back to plain switch order ("" when it did not)
    fallback: str = ""
    #: which ordering won: "pipelines-on-leaves", "stages-in-switch-order", "sorted-hostnames", "switch-order"
    strategy: str = "pipelines-on-leaves"

    def hostfile_text(self) -> str:
        """One hostname per rank: the SLURM_HOSTFILE for ``--distribution=arbitrary``."""
        return "".join(f"{host}\n" for host in self.ranks)


def rank_coords(rank: int, layout: ParallelLayout) -> tuple[int, int, int]:
    """(tp_rank, dp_rank, pp_rank) of a global rank under :data:`MEGATRON_ORDER`."""
    return rank % layout.tp, (rank // layout.tp) % layout.dp, rank // (layout.tp * layout.dp)


def place_selection(
    fabric: Fabric,
    selection: NodeSelection,
    layout: ParallelLayout,
    tasks_per_node: int,
    nvlink_domain_nodes: int = 1,
    nvlink_domains: Mapping[str, str] | None = None,
    traffic: Traffic | None = None,
) -> Placement:
    """:func:`place` on the nodes of a :class:`NodeSelection`."""
    return place(fabric, selection.nodes, layout, tasks_per_node, nvlink_domain_nodes, nvlink_domains, traffic)


def slurm_default(nodes: Sequence[str], tasks_per_node: int) -> Placement:
    """What Slurm does without a hostfile: nodes sorted by name, ranks in blocks per node."""
    return _placement(hostlist.natural_sorted(nodes), tasks_per_node, "", "sorted-hostnames")


def place(
    fabric: Fabric,
    nodes: Sequence[str],
    layout: ParallelLayout,
    tasks_per_node: int,
    nvlink_domain_nodes: int = 1,
    nvlink_domains: Mapping[str, str] | None = None,
    traffic: Traffic | None = None,
) -> Placement:
    """Order ``nodes`` (exactly world_size / tasks_per_node of them) so TP, PP and DP stay close."""
    if tasks_per_node < 1 or nvlink_domain_nodes < 1:
        raise ConfigError(
            f"tasks_per_node ({tasks_per_node}) and nvlink_domain_nodes ({nvlink_domain_nodes}) must be >= 1"
        )
    if layout.world_size % tasks_per_node:
        raise ConfigError(f"world size {layout.world_size} is not a multiple of tasks_per_node {tasks_per_node}")
    node_count = layout.world_size // tasks_per_node
    if len(nodes) != node_count or len(set(nodes)) != len(nodes):
        raise ConfigError(
            f"placement needs {node_count} distinct nodes (world size {layout.world_size} / "
            f"{tasks_per_node} tasks per node), got {len(nodes)}"
        )
    ordered = sorted(nodes, key=lambda n: _switch_position(fabric, n))

    unit, fallback = _unit_nodes(layout, tasks_per_node)
    if fallback:
        log.info("placement: %s; using switch order", fallback)
        return _placement(ordered, tasks_per_node, fallback, "switch-order")
    if unit > nvlink_domain_nodes and nvlink_domains is None:
        raise ConfigError(
            f"tp={layout.tp} spans {unit} nodes of {tasks_per_node} tasks, but an NVLink domain holds "
            f"{nvlink_domain_nodes} node(s); lower tp or raise tasks_per_node"
        )
    units = _units(fabric, ordered, unit, nvlink_domain_nodes, nvlink_domains)
    chains = _chains(fabric, units, layout.pp)
    pipelines = [node for stage in range(layout.pp) for chain in chains for node in chain[stage]]
    best = _placement(pipelines, tasks_per_node, "", "pipelines-on-leaves")
    if traffic is None:
        return best
    candidates = [best, _placement([n for u in units for n in u], tasks_per_node, "", "stages-in-switch-order")]
    if unit == 1:
        candidates.append(slurm_default(nodes, tasks_per_node))
    costs = [score(fabric, c.ranks, layout, traffic) for c in candidates]
    pick = min(
        range(len(candidates)), key=lambda i: (costs[i].above_leaf_bytes, tuple(reversed(costs[i].total_by_level)), i)
    )
    log.info(
        "placement: %s (bytes above the leaves per step: %s)",
        candidates[pick].strategy,
        ", ".join(f"{c.strategy}={cost.above_leaf_bytes:.3g}" for c, cost in zip(candidates, costs, strict=True)),
    )
    return candidates[pick]


def _placement(node_order: Sequence[str], tasks_per_node: int, fallback: str, strategy: str) -> Placement:
    ranks = tuple(node for node in node_order for _ in range(tasks_per_node))
    return Placement(
        node_order=tuple(node_order), ranks=ranks, tasks_per_node=tasks_per_node, fallback=fallback, strategy=strategy
    )


def _switch_position(fabric: Fabric, node: str) -> int:
    try:
        return fabric.node_index[node]
    except KeyError:
        raise TopologyError(f"{fabric.source or 'fabric'}: node {node!r} is not in the topology") from None


def _unit_nodes(layout: ParallelLayout, tasks_per_node: int) -> tuple[int, str]:
    """Nodes per TP group, or a reason why blocks of ranks do not line up with nodes per stage."""
    stage_ranks = layout.tp * layout.dp
    if layout.tp >= tasks_per_node:
        if layout.tp % tasks_per_node:
            return 0, f"tp={layout.tp} is not a multiple of {tasks_per_node} tasks per node"
        return layout.tp // tasks_per_node, ""
    if tasks_per_node % layout.tp:
        return 0, f"{tasks_per_node} tasks per node is not a multiple of tp={layout.tp}"
    if stage_ranks % tasks_per_node:
        return 0, f"a pipeline stage ({stage_ranks} ranks) does not fill whole nodes of {tasks_per_node} tasks"
    return 1, ""


def _units(
    fabric: Fabric,
    ordered: Sequence[str],
    unit: int,
    domain_nodes: int,
    domains: Mapping[str, str] | None,
) -> list[tuple[str, ...]]:
    """Cut TP units of ``unit`` nodes, each inside one NVLink domain (or one node when unit == 1)."""
    if unit == 1:
        return [(node,) for node in ordered]
    groups: dict[object, list[str]] = {}
    for node in ordered:
        if domains is not None:
            key: object = domains.get(node, f"node:{node}")
        else:
            leaf = fabric.leaf_of[node]
            key = (leaf, fabric.switches[leaf].nodes.index(node) // domain_nodes)
        groups.setdefault(key, []).append(node)
    units = [
        tuple(members[i : i + unit]) for members in groups.values() for i in range(0, len(members) - unit + 1, unit)
    ]
    needed = len(ordered) // unit
    if len(units) < needed:
        raise TopologyError(
            f"cannot keep every TP group of {unit} nodes inside one NVLink domain: the chosen nodes form only "
            f"{len(units)} whole groups, {needed} needed; select whole NVLink domains (topology/block)"
        )
    return units


def _chains(fabric: Fabric, units: Sequence[tuple[str, ...]], pp: int) -> list[list[tuple[str, ...]]]:
    """Group units into pipelines of ``pp``: whole chains from one leaf first, then leftovers in switch order."""
    by_leaf: dict[str, list[tuple[str, ...]]] = {}
    for u in units:
        by_leaf.setdefault(fabric.leaf_of[u[0]], []).append(u)
    chains: list[list[tuple[str, ...]]] = []
    leftovers: list[tuple[str, ...]] = []
    for members in by_leaf.values():
        whole = len(members) // pp * pp
        chains.extend(members[i : i + pp] for i in range(0, whole, pp))
        leftovers.extend(members[whole:])
    chains.extend(leftovers[i : i + pp] for i in range(0, len(leftovers), pp))
    position = {u: i for i, u in enumerate(units)}
    chains.sort(key=lambda chain: position[chain[0]])
    return chains
