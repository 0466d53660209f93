"""Node selection: exact choices on small trees, errors, and properties on random fabrics."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from air_hpc.errors import TopologyError
from air_hpc.topology.fabric import Fabric, SwitchSpec, build_fabric
from air_hpc.topology.select import min_leaves, select_nodes
from air_hpc.topology.synthetic import fat_tree

TESTBED = fat_tree([2, 4, 2])


def nodes(expr: str) -> set[str]:
    from air_hpc.slurm import hostlist

    return set(hostlist.expand(expr, "test"))


def test_fits_one_leaf_picks_the_tightest() -> None:
    sel = select_nodes(TESTBED, set(TESTBED.nodes), 2)
    assert sel.nodes == ("n1", "n2")
    assert sel.leaves == ("leaf1",)
    assert sel.switches_by_level == (1,)
    assert sel.switches_hint == 1
    assert sel.lower_bound_leaves == 1
    assert sel.top_switch == "leaf1"
    assert select_nodes(TESTBED, set(TESTBED.nodes), 3).leaves == ("leaf2",)


def test_spans_leaves_when_it_must() -> None:
    sel = select_nodes(TESTBED, set(TESTBED.nodes) - {"n3"}, 4)
    assert sel.leaves == ("leaf1", "leaf3")
    assert sel.nodelist == "n[1-2,7-8]"
    assert sel.switches_by_level == (2, 1)
    assert sel.top_switch == "spine1"
    sel = select_nodes(TESTBED, set(TESTBED.nodes), 8)
    assert sel.nodelist == "n[1-8]"
    assert sel.switches_hint == 3


def test_fewest_leaves_beats_tight_fit_and_tight_fit_keeps_big_leaves_whole() -> None:
    fabric = fat_tree([10, 4, 4, 6])
    sel = select_nodes(fabric, set(fabric.nodes), 8)
    assert sel.leaves == ("leaf1",)
    sel = select_nodes(fabric, set(fabric.nodes), 12)
    assert len(sel.leaves) == 2
    assert sel.leaves == ("leaf1", "leaf2")
    sel = select_nodes(fabric, set(fabric.nodes), 5)
    assert sel.leaves == ("leaf4",)


def test_best_fit_trap_goes_to_the_slightly_bigger_leaf() -> None:
    fabric = fat_tree([16] * 6, leaves_per_spine=3)
    busy: set[str] = set()
    for i, leaf in enumerate(fabric.leaves):
        keep = 13 if i == 4 else 12
        busy.update(fabric.switches[leaf].nodes[keep:])
    sel = select_nodes(fabric, set(fabric.nodes) - busy, 13)
    assert sel.leaves == ("leaf5",)


def test_three_levels_stay_under_one_spine_when_possible() -> None:
    fabric = fat_tree([8, 8, 8, 8], leaves_per_spine=2)
    busy = nodes("n[1-7,25-31]")
    # free: leaf1 1, leaf2 8 | leaf3 8, leaf4 1; spine1 and spine2 hold 9 each
    sel = select_nodes(fabric, set(fabric.nodes) - busy, 9)
    assert sel.top_switch == "spine1"
    assert sel.switches_by_level == (2, 1)
    sel = select_nodes(fabric, set(fabric.nodes) - busy, 16)
    assert sel.top_switch == "core1"
    assert sel.leaves == ("leaf2", "leaf3")
    assert sel.switches_by_level == (2, 2, 1)
    sel = select_nodes(fabric, set(fabric.nodes) - busy, 17)
    assert sel.switches_by_level == (3, 2, 1)


def test_nodes_come_in_switch_order() -> None:
    fabric = fat_tree([4, 4, 4])
    sel = select_nodes(fabric, nodes("n[2-4,6,9-12]"), 7)
    assert list(sel.nodes) == sorted(sel.nodes, key=fabric.node_index.__getitem__)


@pytest.mark.parametrize(
    ("available", "count", "message"),
    [
        ("n[1-8]", 0, "node count must be >= 1"),
        ("n[1-8]", 9, "9 nodes requested but only 8 of 8 are available"),
        ("n[1-3]", 4, "4 nodes requested but only 3 of 8"),
    ],
)
def test_unmeetable_requests(available: str, count: int, message: str) -> None:
    with pytest.raises(TopologyError, match=message) as info:
        select_nodes(TESTBED, nodes(available), count)
    assert info.value.exit_code == 2


def test_separate_fabrics_cannot_be_spanned() -> None:
    forest = build_fabric([SwitchSpec("a", nodes=("x1", "x2")), SwitchSpec("b", nodes=("y1", "y2"))], "two.conf")
    with pytest.raises(TopologyError, match=r"two\.conf: no switch tree has 3 free nodes"):
        select_nodes(forest, {"x1", "x2", "y1", "y2"}, 3)


def test_nodes_outside_the_fabric_are_ignored() -> None:
    sel = select_nodes(TESTBED, {"n1", "elsewhere"}, 1)
    assert sel.nodes == ("n1",)


def test_min_leaves() -> None:
    assert min_leaves([5, 3, 2], 8) == 2
    assert min_leaves([5, 3, 2], 11) == 0
    assert min_leaves([], 1) == 0


@st.composite
def fabrics_and_requests(draw: st.DrawFn) -> tuple:
    leaves = draw(st.lists(st.integers(1, 12), min_size=1, max_size=14))
    per_spine = draw(st.one_of(st.none(), st.integers(1, 4)))
    fabric = fat_tree(leaves, leaves_per_spine=per_spine)
    available = draw(st.sets(st.sampled_from(fabric.nodes), min_size=1))
    count = draw(st.integers(1, len(available)))
    return fabric, available, count


@given(fabrics_and_requests())
@settings(max_examples=300, deadline=None)
def test_selection_properties(case: tuple) -> None:
    fabric, available, count = case
    sel = select_nodes(fabric, available, count)
    assert len(sel.nodes) == count
    assert len(set(sel.nodes)) == count
    assert set(sel.nodes) <= available
    assert {fabric.leaf_of[n] for n in sel.nodes} == set(sel.leaves)
    assert len(sel.leaves) >= sel.lower_bound_leaves
    assert sel.switches_hint == len(sel.leaves) == sel.switches_by_level[0]
    assert sel.switches_by_level[-1] == 1
    assert all(sel.top_switch in fabric.path_of(n) for n in sel.nodes)
    lowest = min(
        (s.level for name, s in fabric.switches.items() if sum(n in available for n in _under(fabric, name)) >= count)
    )
    assert fabric.switches[sel.top_switch].level == lowest
    top = fabric.switches[sel.top_switch]
    if not top.is_leaf:
        free_children = sorted((sum(n in available for n in _under(fabric, c)) for c in top.children), reverse=True)
        used_children = {fabric.ancestors(leaf)[top.level - 1] for leaf in sel.leaves}
        assert len(used_children) == min_leaves(free_children, count)
    assert select_nodes(fabric, set(available), count) == sel


def _under(fabric, switch: str) -> list[str]:
    return [n for leaf in fabric.leaves_under[switch] for n in fabric.switches[leaf].nodes]


def test_unbalanced_tree_counts_switches_by_their_level() -> None:
    fabric = build_fabric(
        [
            SwitchSpec("l1", nodes=("a1", "a2")),
            SwitchSpec("l2", nodes=("b1",)),
            SwitchSpec("l3", nodes=("c1",)),
            SwitchSpec("s1", children=("l1",)),
            SwitchSpec("core", children=("s1", "l2", "l3")),
        ]
    )
    sel = select_nodes(fabric, {"a1", "a2", "b1"}, 3)
    assert sel.top_switch == "core"
    assert sel.switches_by_level == (2, 1, 1)
    assert select_nodes(fabric, {"b1", "c1"}, 2).switches_by_level == (2, 0, 1)


@st.composite
def random_fabric(draw: st.DrawFn) -> tuple[Fabric, set[str], int]:
    leaves = draw(st.lists(st.integers(1, 5), min_size=1, max_size=9))
    per_spine = draw(st.one_of(st.none(), st.integers(1, 4)))
    fabric = fat_tree(leaves, leaves_per_spine=per_spine)
    available = {n for n in fabric.nodes if draw(st.booleans())} or {fabric.nodes[0]}
    return fabric, available, draw(st.integers(1, len(available)))


def _brute_force(fabric: Fabric, available: set[str], count: int) -> tuple[int, int, int] | None:
    """(height of the lowest common switch, spines, leaves) minimised over every subset of leaves."""
    free = {leaf: sum(n in available for n in fabric.switches[leaf].nodes) for leaf in fabric.leaves}
    best = None
    for size in range(1, len(fabric.leaves) + 1):
        for group in itertools.combinations([leaf for leaf in fabric.leaves if free[leaf]], size):
            if sum(free[leaf] for leaf in group) < count:
                continue
            shared = set(fabric.ancestors(group[0])).intersection(*(fabric.ancestors(x) for x in group[1:]))
            if not shared:
                continue
            height = min(fabric.switches[s].level for s in shared)
            spines = len({fabric.switches[leaf].parent for leaf in group}) if size > 1 else 0
            key = (height, spines, size)
            best = key if best is None or key < best else best
    return best


@settings(max_examples=400, deadline=None)
@given(random_fabric())
def test_tree_selection_is_the_exact_optimum(case: tuple[Fabric, set[str], int]) -> None:
    fabric, available, count = case
    expected = _brute_force(fabric, available, count)
    try:
        sel = select_nodes(fabric, available, count)
    except TopologyError:
        assert expected is None
        return
    leaves = sel.leaves
    height = fabric.switches[sel.top_switch].level
    spines = len({fabric.switches[leaf].parent for leaf in leaves}) if len(leaves) > 1 else 0
    assert (height, spines, len(leaves)) == expected
    assert set(sel.nodes) <= available and len(set(sel.nodes)) == count
