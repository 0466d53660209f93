"""Rank placement (checked against Megatron-core's own RankGenerator) and the traffic cost model."""

import pytest

from air_hpc.config.layout import ParallelLayout
from air_hpc.errors import ConfigError, TopologyError
from air_hpc.topology.cost import Traffic, score
from air_hpc.topology.fabric import Fabric, SwitchSpec, build_fabric
from air_hpc.topology.place import MEGATRON_ORDER, place, place_selection, rank_coords, slurm_default
from air_hpc.topology.select import select_nodes
from air_hpc.topology.synthetic import fat_tree


@pytest.mark.parametrize(("tp", "pp", "dp"), [(2, 2, 2), (4, 1, 2), (1, 4, 3), (2, 3, 2)])
def test_rank_order_is_megatrons(tp: int, pp: int, dp: int) -> None:
    from megatron.core.parallel_state import RankGenerator

    gen = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=1, order=MEGATRON_ORDER)
    layout = ParallelLayout(tp=tp, pp=pp, dp=dp)
    for token, axis in (("tp", 0), ("dp", 1), ("pp", 2)):
        ours: dict[tuple[int, ...], list[int]] = {}
        for rank in range(layout.world_size):
            coords = rank_coords(rank, layout)
            key = tuple(c for i, c in enumerate(coords) if i != axis)
            ours.setdefault(key, []).append(rank)
        assert sorted(ours.values()) == sorted(gen.get_ranks(token))


def groups(ranks: tuple[str, ...], layout: ParallelLayout, axis: int) -> list[list[str]]:
    by_key: dict[tuple[int, ...], list[tuple[int, str]]] = {}
    for rank, host in enumerate(ranks):
        coords = rank_coords(rank, layout)
        key = tuple(c for i, c in enumerate(coords) if i != axis)
        by_key.setdefault(key, []).append((coords[axis], host))
    return [[host for _, host in sorted(members)] for members in by_key.values()]


def test_tp_in_node_pp_on_leaf_dp_in_switch_order() -> None:
    fabric = fat_tree([4, 4, 4, 4])
    layout = ParallelLayout(tp=8, pp=4, dp=4)
    placement = place(fabric, fabric.nodes, layout, tasks_per_node=8)
    assert len(placement.ranks) == layout.world_size == 128
    assert placement.hostfile_text().count("\n") == 128
    assert all(len(set(g)) == 1 for g in groups(placement.ranks, layout, 0))
    for chain in groups(placement.ranks, layout, 2):
        assert len({fabric.leaf_of[h] for h in chain}) == 1
    for ring in groups(placement.ranks, layout, 1):
        positions = [fabric.node_index[h] for h in ring]
        assert positions == sorted(positions)
    assert placement.fallback == ""


def test_several_tp_groups_per_node() -> None:
    fabric = fat_tree([2, 2])
    layout = ParallelLayout(tp=2, pp=2, dp=4)
    placement = place(fabric, fabric.nodes, layout, tasks_per_node=4)
    assert all(len(set(g)) == 1 for g in groups(placement.ranks, layout, 0))
    for chain in groups(placement.ranks, layout, 2):
        assert len({fabric.leaf_of[h] for h in chain}) == 1


def test_tp_across_nodes_stays_in_nvlink_domain() -> None:
    fabric = fat_tree([6, 6])
    layout = ParallelLayout(tp=8, pp=2, dp=2)
    placement = place(fabric, ("n1", "n2", "n3", "n4", "n7", "n8", "n9", "n10"), layout, 4, nvlink_domain_nodes=2)
    for group in groups(placement.ranks, layout, 0):
        hosts = sorted({int(h[1:]) for h in group})
        assert len(hosts) == 2
        leaf_nodes = fabric.switches[fabric.leaf_of[f"n{hosts[0]}"]].nodes
        assert leaf_nodes.index(f"n{hosts[0]}") // 2 == leaf_nodes.index(f"n{hosts[1]}") // 2
    domains = {f"n{i}": f"rack{(i - 1) // 4}" for i in range(1, 13)}
    placement = place(fabric, ("n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8"), layout, 4, 4, domains)
    for group in groups(placement.ranks, layout, 0):
        assert len({domains[h] for h in group}) == 1


def test_tp_that_cannot_stay_in_a_domain_is_an_error() -> None:
    fabric = fat_tree([6, 6])
    layout = ParallelLayout(tp=8, pp=1, dp=3)
    with pytest.raises(TopologyError, match="cannot keep every TP group of 2 nodes inside one NVLink domain"):
        place(fabric, ("n1", "n3", "n5", "n7", "n9", "n11"), layout, 4, nvlink_domain_nodes=2)
    with pytest.raises(ConfigError, match=r"spans 2 nodes .* an NVLink domain holds 1"):
        place(fabric, fabric.nodes[:6], layout, 4)


def test_layouts_that_do_not_tile_nodes_fall_back_to_switch_order() -> None:
    fabric = fat_tree([2, 2])
    layout = ParallelLayout(tp=2, pp=4, dp=1)
    placement = place(fabric, ("n4", "n1"), layout, tasks_per_node=4)
    assert placement.node_order == ("n1", "n4")
    assert "does not fill whole nodes" in placement.fallback


@pytest.mark.parametrize(
    ("nodes", "tpn", "message"),
    [
        (("n1", "n2"), 4, "needs 4 distinct nodes"),
        (("n1", "n1", "n2", "n3"), 4, "needs 4 distinct nodes"),
        (("n1", "n2", "n3", "n4"), 3, "not a multiple of tasks_per_node 3"),
        (("n1", "n2", "n3", "n4"), 0, "must be >= 1"),
    ],
)
def test_bad_placement_requests(nodes: tuple[str, ...], tpn: int, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        place(fat_tree([4]), nodes, ParallelLayout(tp=4, pp=2, dp=2), tpn)


def test_unknown_node_is_a_topology_error() -> None:
    with pytest.raises(TopologyError, match="node 'x9' is not in the topology"):
        place(fat_tree([4]), ("n1", "x9"), ParallelLayout(tp=1, pp=1, dp=2), 1)


def test_place_selection_uses_the_selected_nodes() -> None:
    fabric = fat_tree([2, 4, 2])
    sel = select_nodes(fabric, set(fabric.nodes), 4)
    placement = place_selection(fabric, sel, ParallelLayout(tp=1, pp=2, dp=2), 1)
    assert set(placement.node_order) == set(sel.nodes)


def interleaved_fabric() -> Fabric:
    """Hostname order jumps between leaves: n1,n5,n9 on leaf1, n2,n6,... on leaf2 (a common cabling)."""
    specs = [SwitchSpec(f"leaf{k}", nodes=tuple(f"n{i}" for i in range(k, 17, 4))) for k in range(1, 5)]
    specs += [SwitchSpec("spine1", children=("leaf1", "leaf2")), SwitchSpec("spine2", children=("leaf3", "leaf4"))]
    specs.append(SwitchSpec("core1", children=("spine1", "spine2")))
    return build_fabric(specs)


LAYOUT = ParallelLayout(tp=8, pp=4, dp=4)
PP_HEAVY = Traffic(dp_grad_bytes=1e8, pp_activation_bytes=1e8, microbatches=64)
DP_HEAVY = Traffic(dp_grad_bytes=1e10, pp_activation_bytes=1e6, microbatches=4)


@pytest.mark.parametrize("fabric", [interleaved_fabric(), fat_tree([4, 4, 4, 4], leaves_per_spine=2)])
@pytest.mark.parametrize("traffic", [PP_HEAVY, DP_HEAVY, Traffic.for_gpt(1_300_000_000, 2048, 2048, 1, 16, LAYOUT)])
def test_cost_model_never_loses_to_sorted_hostnames(fabric: Fabric, traffic: Traffic) -> None:
    ours = place(fabric, fabric.nodes, LAYOUT, 8, traffic=traffic)
    default = slurm_default(fabric.nodes, 8)
    ours_cost = score(fabric, ours.ranks, LAYOUT, traffic)
    default_cost = score(fabric, default.ranks, LAYOUT, traffic)
    assert ours_cost.above_leaf_bytes <= default_cost.above_leaf_bytes
    assert ours_cost.total_by_level[0] == default_cost.total_by_level[0]


def test_traffic_decides_between_pipelines_and_stages() -> None:
    fabric = fat_tree([4, 4, 4, 4], leaves_per_spine=2)
    pp_heavy = place(fabric, fabric.nodes, LAYOUT, 8, traffic=PP_HEAVY)
    assert pp_heavy.strategy == "pipelines-on-leaves"
    assert score(fabric, pp_heavy.ranks, LAYOUT, PP_HEAVY).pp_bytes_by_level[1] == 0
    dp_heavy = place(fabric, fabric.nodes, LAYOUT, 8, traffic=DP_HEAVY)
    assert dp_heavy.strategy in ("stages-in-switch-order", "sorted-hostnames")
    assert score(fabric, dp_heavy.ranks, LAYOUT, DP_HEAVY).dp_bytes_by_level[1] == 0
    assert place(fabric, fabric.nodes, LAYOUT, 8).strategy == "pipelines-on-leaves"


def test_interleaved_hostnames_cost_more_than_switch_order() -> None:
    fabric = interleaved_fabric()
    ours = score(fabric, place(fabric, fabric.nodes, LAYOUT, 8, traffic=DP_HEAVY).ranks, LAYOUT, DP_HEAVY)
    default = score(fabric, slurm_default(fabric.nodes, 8).ranks, LAYOUT, DP_HEAVY)
    assert ours.above_leaf_bytes < default.above_leaf_bytes / 2


def test_cost_counts_bytes_per_level_exactly() -> None:
    fabric = fat_tree([1, 1], leaves_per_spine=1)
    layout = ParallelLayout(tp=1, pp=1, dp=2)
    report = score(fabric, ("n1", "n2"), layout, Traffic(dp_grad_bytes=100.0, pp_activation_bytes=0.0))
    # ring of 2: each rank sends 2*(2-1)/2*100 = 100 bytes; n1 and n2 meet at core1 (level 2)
    assert report.dp_bytes_by_level == (200.0, 200.0, 200.0)
    assert report.intra_node_bytes == 0.0
    same_node = score(fabric, ("n1", "n1"), layout, Traffic(dp_grad_bytes=100.0, pp_activation_bytes=0.0))
    assert same_node.intra_node_bytes == 200.0
    assert same_node.dp_bytes_by_level == (0.0, 0.0, 0.0)
    pp = score(fabric, ("n1", "n2"), ParallelLayout(tp=1, pp=2, dp=1), Traffic(0.0, 10.0, microbatches=3))
    assert pp.pp_bytes_by_level == (60.0, 60.0, 60.0)
    with pytest.raises(ConfigError, match="rank map has 1 entries"):
        score(fabric, ("n1",), layout, Traffic(1.0, 1.0))
