"""The fabric model: checks in build_fabric, levels, paths, and the synthetic trees others rely on."""

import pytest

from air_hpc.errors import TopologyError
from air_hpc.exitcodes import ExitCode
from air_hpc.topology.fabric import SwitchSpec, build_fabric
from air_hpc.topology.synthetic import fat_tree, random_leaf_sizes, sized_fat_tree


def test_testbed_tree_has_the_names_the_testbed_uses() -> None:
    fabric = fat_tree([2, 4, 2])
    assert fabric.leaves == ("leaf1", "leaf2", "leaf3")
    assert fabric.roots == ("spine1",)
    assert fabric.switches["leaf1"].nodes == ("n1", "n2")
    assert fabric.switches["leaf2"].nodes == ("n3", "n4", "n5", "n6")
    assert fabric.switches["leaf3"].nodes == ("n7", "n8")
    assert fabric.switches["spine1"].children == ("leaf1", "leaf2", "leaf3")
    assert fabric.nodes == tuple(f"n{i}" for i in range(1, 9))
    assert fabric.height == 2
    assert fabric.leaf_of["n5"] == "leaf2"


def test_three_and_four_level_trees() -> None:
    three = fat_tree([3] * 5, leaves_per_spine=2)
    assert three.height == 3
    assert three.roots == ("core1",)
    assert three.switches["core1"].children == ("spine1", "spine2", "spine3")
    assert three.path_of("n13") == ("leaf5", "spine3", "core1")
    four = fat_tree([1] * 8, leaves_per_spine=2, spines_per_core=2)
    assert four.height == 4
    assert four.roots == ("top1",)


def test_single_leaf_is_one_level() -> None:
    fabric = fat_tree([4])
    assert fabric.height == 1
    assert fabric.roots == ("leaf1",)


def test_common_level() -> None:
    fabric = fat_tree([2, 2, 2, 2], leaves_per_spine=2)
    assert fabric.common_level("n1", "n1") == -1
    assert fabric.common_level("n1", "n2") == 0
    assert fabric.common_level("n1", "n3") == 1
    assert fabric.common_level("n1", "n8") == 2


def test_sized_tree_has_exactly_the_requested_nodes() -> None:
    fabric = sized_fat_tree(1000, 3, seed=3)
    assert len(fabric.nodes) == 1000
    assert all(16 <= len(fabric.switches[leaf].nodes) <= 64 for leaf in fabric.leaves[:-1])
    assert fabric.height == 3


def test_random_leaf_sizes_add_up() -> None:
    import random

    sizes = random_leaf_sizes(777, 16, 64, random.Random(1))
    assert sum(sizes) == 777


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        ([], "no switches defined"),
        ([SwitchSpec("a", nodes=("n1",), line=1), SwitchSpec("a", nodes=("n2",), line=2)], "defined twice"),
        ([SwitchSpec("a", nodes=("n1",), children=("b",), line=3)], "both Switches= and Nodes="),
        ([SwitchSpec("a", line=4)], "neither Switches= nor Nodes="),
        ([SwitchSpec("s", children=("ghost",), line=5)], "unknown switch 'ghost'"),
        ([SwitchSpec("s", children=("s",), line=6)], "lists itself"),
        (
            [
                SwitchSpec("a", children=("b",), line=1),
                SwitchSpec("b", children=("a",), line=2),
                SwitchSpec("l", nodes=("n1",), line=3),
            ],
            "cycle",
        ),
        (
            [SwitchSpec("l1", nodes=("n1",), line=1), SwitchSpec("l2", nodes=("n1",), line=2)],
            "node 'n1' is under both 'l1' and 'l2'",
        ),
        (
            [
                SwitchSpec("l1", nodes=("n1",), line=1),
                SwitchSpec("s1", children=("l1",), line=2),
                SwitchSpec("s2", children=("l1",), line=3),
            ],
            "under both 's1' and 's2'",
        ),
    ],
)
def test_bad_fabrics_name_file_and_line(specs: list[SwitchSpec], message: str) -> None:
    with pytest.raises(TopologyError, match=message) as info:
        build_fabric(specs, "topo.conf")
    assert str(info.value).startswith("topo.conf")
    assert info.value.exit_code == ExitCode.USAGE


def test_unbalanced_tree_levels_are_longest_path() -> None:
    fabric = build_fabric(
        [
            SwitchSpec("l1", nodes=("a",)),
            SwitchSpec("l2", nodes=("b",)),
            SwitchSpec("s1", children=("l1",)),
            SwitchSpec("core", children=("s1", "l2")),
        ]
    )
    assert fabric.switches["core"].level == 2
    assert fabric.common_level("a", "b") == 2


def test_forest_has_several_roots_and_no_common_switch() -> None:
    fabric = build_fabric([SwitchSpec("l1", nodes=("a",)), SwitchSpec("l2", nodes=("b",))])
    assert fabric.roots == ("l1", "l2")
    assert fabric.common_level("a", "b") == fabric.height
    with pytest.raises(TopologyError, match="not under any leaf"):
        fabric.path_of("zzz")
