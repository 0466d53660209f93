"""topology.conf (tree and block) readers and writers, NVLink CSV, and hostlist round trips."""

import hostlist as python_hostlist
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from air_hpc.errors import InputError, TopologyError, UserError
from air_hpc.slurm import hostlist
from air_hpc.topology import files, treeconf
from air_hpc.topology.synthetic import fat_tree

TESTBED_CONF = """\
# the lead's testbed
SwitchName=leaf1 Nodes=n[1-2]
SwitchName=leaf2 Nodes=n[3-6]   # a comment after the line
SwitchName=leaf3 Nodes=n[7-8] LinkSpeed=100
switchname=spine1 switches=leaf[1-3]
"""


def test_parse_testbed_conf() -> None:
    fabric = treeconf.parse(TESTBED_CONF, "topology.conf")
    expected = fat_tree([2, 4, 2])
    assert dict(fabric.leaf_of) == dict(expected.leaf_of)
    assert {n: s.level for n, s in fabric.switches.items()} == {n: s.level for n, s in expected.switches.items()}
    assert fabric.leaves == ("leaf1", "leaf2", "leaf3")
    assert fabric.switches["spine1"].children == ("leaf1", "leaf2", "leaf3")
    assert fabric.switches["leaf2"].nodes == ("n3", "n4", "n5", "n6")
    assert fabric.switches["leaf2"].comment == "a comment after the line"
    assert fabric.switches["leaf1"].comment == "the lead's testbed"


def test_render_writes_leaves_first_then_levels_up() -> None:
    text = treeconf.render(fat_tree([2, 4, 2]), header="made by a test")
    assert text == (
        "# made by a test\n"
        "SwitchName=leaf1 Nodes=n[1-2]\n"
        "SwitchName=leaf2 Nodes=n[3-6]\n"
        "SwitchName=leaf3 Nodes=n[7-8]\n"
        "SwitchName=spine1 Switches=leaf[1-3]\n"
    )


def test_continuation_lines() -> None:
    fabric = treeconf.parse("SwitchName=l1 \\\n  Nodes=a[1-3]\nSwitchName=s Switches=l1\n", "t.conf")
    assert fabric.switches["l1"].nodes == ("a1", "a2", "a3")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "t.conf: no switches defined"),
        ("# only a comment\n\n", "t.conf: no switches defined"),
        ("SwitchName=l1 Nodes=n1\nSwitchName l2 Nodes=n2\n", "t.conf:2: cannot parse 'SwitchName'"),
        ("SwitchName=l1 Nodes=n1 Color=red\n", "t.conf:1: unknown key 'Color'"),
        ("Nodes=n[1-2]\n", "t.conf:1: no SwitchName="),
        ("SwitchName=l1 Nodes=n[5-1]\n", r"t.conf:1: bad hostlist 'n\[5-1\]'"),
        ("SwitchName=l1 Nodes=n[1-\n", "t.conf:1: bad hostlist"),
        ("SwitchName=l1 Nodes=n1 Nodes=n2\n", "t.conf:1: key 'Nodes' given twice"),
        ("SwitchName=l1 Nodes=n[1-2],n1\n", "t.conf:1: hostlist 'n\\[1-2\\],n1' names 'n1' twice"),
        ("SwitchName=l1 Nodes=n1\nSwitchName=s1 Switches=l1,l9\n", "t.conf:2: switch 's1' lists unknown switch 'l9'"),
        ("SwitchName=l1 Nodes=n1\nSwitchName=l2 Nodes=n1\n", "t.conf:2: node 'n1' is under both 'l1' and 'l2'"),
        (
            "SwitchName=l1 Nodes=n1\nSwitchName=a Switches=b,l1\nSwitchName=b Switches=a\n",
            "t.conf:[23]: switches form a cycle",
        ),
        ("BlockName=b1 Nodes=n[1-4]\n", "t.conf:1: block topology line in a tree"),
    ],
)
def test_bad_tree_conf_names_file_and_line(text: str, message: str) -> None:
    with pytest.raises(UserError, match=message) as info:
        treeconf.parse(text, "t.conf")
    assert info.value.exit_code == 2
    assert "\n" not in str(info.value)


def test_block_round_trip() -> None:
    text = "# rack A\nBlockName=block1 Nodes=gb[001-018]\nBlockName=block2 Nodes=gb[019-036]\nBlockSizes=18,36\n"
    blocks = treeconf.parse_block(text, "block.conf")
    assert [b.name for b in blocks.blocks] == ["block1", "block2"]
    assert blocks.block_sizes == (18, 36)
    assert len(blocks.blocks[1].nodes) == 18
    assert treeconf.parse_block(treeconf.render_block(blocks), "again") == blocks.__class__(
        blocks=blocks.blocks, block_sizes=blocks.block_sizes, source="again"
    )
    fabric = blocks.to_fabric()
    assert fabric.leaves == ("block1", "block2")
    assert fabric.leaf_of["gb020"] == "block2"
    assert files.read_any(text, "block.conf").leaves == ("block1", "block2")
    assert files.read_any(TESTBED_CONF, "tree.conf").leaves == ("leaf1", "leaf2", "leaf3")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "b.conf: no blocks defined"),
        ("BlockName=b1\n", "b.conf:1: expected 'BlockName=NAME Nodes=HOSTLIST'"),
        ("BlockName=b1 Nodes=n[1-2]\nBlockName=b1 Nodes=n[3-4]\n", "b.conf:2: block 'b1' defined twice"),
        ("BlockName=b1 Nodes=n[1-2]\nBlockName=b2 Nodes=n[2-3]\n", "b.conf:2: node 'n2' is in both block"),
        ("BlockName=b1 Nodes=n[1-2]\nBlockSizes=4,2\n", "b.conf:2: BlockSizes=4,2 must be positive node counts"),
        (
            "BlockName=b1 Nodes=n[1-18]\nBlockSizes=18,54\n",
            "b.conf:2: BlockSizes=18,54: 54 is not the base block size 18 times a power of two",
        ),
        (
            "BlockName=b1 Nodes=n[1-18]\nBlockName=b2 Nodes=n[19-35]\nBlockSizes=18,36\n",
            "b.conf:2: block 'b2' has 17 node\\(s\\), fewer than the base block size 18",
        ),
        ("BlockName=b1 Nodes=n[1-4]\nBlockName=b2 Nodes=n[5-7]\n", "b.conf:2: block 'b2' has 3 node"),
        ("BlockName=b1 Nodes=n[1-2]\nBlockSizes=two\n", "b.conf:2: BlockSizes='two' must be a comma-separated"),
        ("BlockName=b1 Nodes=n[4-2]\n", "b.conf:1: bad hostlist"),
        ("SwitchName=s Nodes=n1\n", "b.conf:1: SwitchName= line in a block"),
    ],
)
def test_bad_block_conf(text: str, message: str) -> None:
    with pytest.raises(TopologyError if "hostlist" not in message else InputError, match=message):
        treeconf.parse_block(text, "b.conf")


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["n01", "n02", "n03", "n5"], "n[01-03,5]"),
        (["n5", "n01", "a1", "n02"], "a1,n[01-02,5]"),
        (["n9", "n10", "n11"], "n[9-11]"),
        (["n8", "n09", "n010"], "n[8,09,010]"),
        # Slurm rejects a range followed by a suffix ("R[01-02]-IBSPINE"): only trailing numbers are ranged
        (["R01-IBSPINE", "R02-IBSPINE"], "R01-IBSPINE,R02-IBSPINE"),
        (["dgx-a09-01", "dgx-a09-02", "dgx-a10-01"], "dgx-a09-[01-02],dgx-a10-01"),
    ],
)
def test_compress_like_scontrol(names: list[str], expected: str) -> None:
    assert hostlist.compress(names) == expected


# -------------------------------------------------------------- properties
names = st.builds(
    lambda prefix, width, number, suffix: f"{prefix}{number:0{width}d}{suffix}",
    st.sampled_from(["n", "gpu", "dgx-a09-", "node_", "n-a"]),
    st.integers(1, 4),
    st.integers(0, 999),
    st.sampled_from(["", "", "", "-IBSPINE", "x"]),
)


@given(st.sets(names, min_size=1, max_size=60))
@settings(max_examples=150, deadline=None)
def test_hostlist_round_trip(nodes: set[str]) -> None:
    expr = hostlist.compress(nodes)
    assert sorted(hostlist.expand(expr, "prop")) == sorted(nodes)
    assert hostlist.natural_sorted(nodes) == python_hostlist.expand_hostlist(expr)


@given(st.lists(st.integers(1, 12), min_size=1, max_size=12), st.one_of(st.none(), st.integers(1, 4)))
@settings(max_examples=100, deadline=None)
def test_tree_render_parse_round_trip(leaves: list[int], per_spine: int | None) -> None:
    fabric = fat_tree(leaves, leaves_per_spine=per_spine)
    again = treeconf.parse(treeconf.render(fabric), "rt.conf")
    assert set(again.switches) == set(fabric.switches)
    assert dict(again.leaf_of) == dict(fabric.leaf_of)
    assert {n: s.level for n, s in again.switches.items()} == {n: s.level for n, s in fabric.switches.items()}
    assert {n: s.parent for n, s in again.switches.items()} == {n: s.parent for n, s in fabric.switches.items()}


@given(st.text(alphabet=st.characters(codec="ascii", exclude_characters="\r\x0b\x0c\x1c\x1d\x1e\x85"), max_size=80))
@settings(max_examples=200, deadline=None)
def test_parser_never_fails_with_anything_but_a_user_error(line: str) -> None:
    text = f"SwitchName=l1 Nodes=n[1-2]\n{line}\nSwitchName=s1 Switches=l1\n"
    try:
        fabric = treeconf.parse(text, "fuzz.conf")
    except UserError as exc:
        assert str(exc).startswith("fuzz.conf")
    else:
        assert "n1" in fabric.leaf_of
