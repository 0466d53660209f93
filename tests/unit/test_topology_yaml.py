"""topology.yaml (Slurm 25.05): round trips for tree and block, the cluster default, errors with file and line."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from air_hpc.errors import TopologyError, UserError
from air_hpc.topology import files, topoyaml, treeconf
from air_hpc.topology.fabric import Fabric
from air_hpc.topology.synthetic import fat_tree
from air_hpc.topology.treeconf import Block, BlockTopology

SLURM_EXAMPLE = """\
- topology: topo1
  cluster_default: True
  tree:
    switches:
    - switch: sw_root
      nodes: node[01-04]
- topology: topo2
  cluster_default: False
  block:
    block_sizes:
      - 4
      - 16
    blocks:
    - block: b1
      nodes: node[01-04]
    - block: b2
      nodes: node[05-08]
    - block: b3
      nodes: node[09-12]
    - block: b4
      nodes: node[13-16]
- topology: topo3
  cluster_default: False
  flat: True
"""


def test_reads_the_example_of_the_man_page() -> None:
    named = topoyaml.parse(SLURM_EXAMPLE, "topology.yaml")
    assert [t.name for t in named] == ["topo1", "topo2", "topo3"]
    tree = files.read_topology(SLURM_EXAMPLE, "topology.yaml")
    assert isinstance(tree, Fabric) and tree.nodes == ("node01", "node02", "node03", "node04")
    block = named[1].topology
    assert isinstance(block, BlockTopology) and block.block_sizes == (4, 16) and len(block.blocks) == 4
    assert named[2].topology is None


@settings(max_examples=60, deadline=None)
@given(
    leaves=st.lists(st.integers(1, 6), min_size=1, max_size=8),
    per_spine=st.one_of(st.none(), st.integers(1, 3)),
    blocks=st.integers(1, 9),
    base=st.integers(1, 5),
)
def test_tree_and_block_round_trip(leaves: list[int], per_spine: int | None, blocks: int, base: int) -> None:
    tree = fat_tree(leaves, leaves_per_spine=per_spine)
    sizes = tuple(base << k for k in range(blocks.bit_length()))
    block = BlockTopology(
        blocks=tuple(
            Block(name=f"block{i + 1}", nodes=tuple(f"gb{i * base + k + 1:03d}" for k in range(base)))
            for i in range(blocks)
        ),
        block_sizes=sizes,
    )
    text = topoyaml.render(tree, block)
    back = topoyaml.parse(text, "t.yaml")
    got_block, got_tree = back[0].topology, back[1].topology
    assert isinstance(got_block, BlockTopology) and isinstance(got_tree, Fabric)
    assert [(b.name, b.nodes) for b in got_block.blocks] == [(b.name, b.nodes) for b in block.blocks]
    assert got_block.block_sizes == sizes
    assert {n: (s.children, s.nodes, s.level) for n, s in got_tree.switches.items()} == {
        n: (s.children, s.nodes, s.level) for n, s in tree.switches.items()
    }
    conf_again = treeconf.parse_block(treeconf.render_block(got_block), "b.conf")
    assert conf_again.blocks == got_block.blocks


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: b\n", "t.yaml:1: expected a list of topologies"),
        ("- topology: x\n  tree:\n    switches: []\n", "t.yaml:3: switches must be a non-empty list"),
        ("- topology: x\n  tree: {}\n  flat: true\n", "t.yaml:1: topology 'x' must define exactly one"),
        ("- topology: x\n  block:\n    blocks:\n    - block: b1\n      nodes: n[1-2]\n      speed: 1\n", "t.yaml:6"),
        (
            "- topology: x\n  block:\n    block_sizes: [2, 6]\n    blocks:\n    - block: b1\n      nodes: n[1-2]\n",
            "t.yaml:3: BlockSizes=2,6: 6 is not the base block size 2",
        ),
        (
            "- topology: x\n  block:\n    blocks:\n    - block: b1\n      nodes: n[1-2]\n    - block: b2\n"
            "      nodes: n[2-3]\n",
            "t.yaml:6: node 'n2' is in both block 'b1' and 'b2'",
        ),
        ("- topology: x\n  tree:\n    switches:\n    - switch: s\n      nodes: n[2-1]\n", "t.yaml:4: bad hostlist"),
        ("- topology: x\n  tree:\n   - a\n  - b", "t.yaml:4: not valid YAML"),
        ("- topology: x\n  flat: true\n", "t.yaml: the default topology 'x' is flat"),
    ],
)
def test_bad_yaml_names_file_and_line(text: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        files.read_topology(text, "t.yaml")


def test_render_needs_something() -> None:
    with pytest.raises(TopologyError):
        topoyaml.render(None, None)
