"""Block topologies from NVLink domains or IB leaves: nominal base size, IB order, BlockSizes checks."""

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from air_hpc.errors import InputError, TopologyError, UserError
from air_hpc.topology import block_build, treeconf
from air_hpc.topology.fabric import SwitchSpec, build_fabric
from air_hpc.topology.synthetic import fat_tree

NVLINK_CSV = """\
hostname, fabric.clusterUuid, fabric.cliqueId
gb02, 1b2c3d4e-0000-4000-8000-00000000aaaa, 32766
gb01, 1B2C3D4E-0000-4000-8000-00000000AAAA, 32766
gb01, 1b2c3d4e-0000-4000-8000-00000000aaaa, 32766
gb03, 1b2c3d4e-0000-4000-8000-00000000aaaa, 32767
gb06, 1b2c3d4e-0000-4000-8000-00000000aaaa, 32767
gb04, 00000000-0000-0000-0000-000000000000, 0
gb05, N/A, N/A
"""


def test_nvlink_csv_to_blocks() -> None:
    domains = block_build.read_nvlink_csv(NVLINK_CSV, "fabric.csv")
    assert set(domains) == {"gb01", "gb02", "gb03", "gb06"}
    built = block_build.blocks_from_domains(domains, "fabric.csv")
    blocks = built.topology
    assert [b.nodes for b in blocks.blocks] == [("gb01", "gb02"), ("gb03", "gb06")]
    assert blocks.block_sizes == (2, 4)
    assert "cliqueId=32766" in blocks.blocks[0].comment
    lines = [line for line in treeconf.render_block(blocks).splitlines() if not line.startswith("#")]
    assert lines == ["BlockName=block1 Nodes=gb[01-02]", "BlockName=block2 Nodes=gb[03,06]", "BlockSizes=2,4"]


def nvl_domains(trays: int, domains: int, missing: frozenset[int] = frozenset()) -> dict[str, tuple[str, str]]:
    return {
        f"gb{d * trays + t + 1:03d}": ("uuid", str(d))
        for d in range(domains)
        for t in range(trays)
        if d * trays + t + 1 not in missing
    }


def test_a_missing_tray_does_not_shrink_the_base_block() -> None:
    """One tray short must not give BlockSizes=17,...: Slurm would then refuse --segment=18 everywhere."""
    built = block_build.blocks_from_domains(nvl_domains(18, 4, frozenset({20})), "n.csv")
    assert built.topology.block_sizes == (18, 36)
    assert [len(b.nodes) for b in built.topology.blocks] == [18, 18, 18]
    assert len(built.skipped) == 1 and "gb[019,021-036]" in built.skipped[0] and "17 node(s)" in built.skipped[0]
    treeconf.parse_block(treeconf.render_block(built.topology), "again")  # Slurm's rules hold


def test_explicit_block_sizes_are_checked_like_slurm() -> None:
    built = block_build.blocks_from_domains(nvl_domains(18, 4), "n.csv", (18, 72))
    assert built.topology.block_sizes == (18, 72)
    with pytest.raises(TopologyError, match="--block-sizes: BlockSizes=18,54: 54 is not the base block size 18"):
        block_build.blocks_from_domains(nvl_domains(18, 4), "n.csv", (18, 54))


def test_blocks_follow_ib_leaves_not_hostnames() -> None:
    """Hostnames interleave racks over leaves; blocks under one leaf must be adjacent (Slurm aggregates neighbours)."""
    domains = {f"gb{i:02d}": ("u", str((i - 1) % 4)) for i in range(1, 17)}  # domain d = gb(d+1), gb(d+5), ...
    leaf_of_domain = {"0": "leafB", "1": "leafA", "2": "leafB", "3": "leafA"}
    specs = [
        SwitchSpec("leafA", nodes=tuple(n for n, d in sorted(domains.items()) if leaf_of_domain[d[1]] == "leafA")),
        SwitchSpec("leafB", nodes=tuple(n for n, d in sorted(domains.items()) if leaf_of_domain[d[1]] == "leafB")),
        SwitchSpec("spine", children=("leafA", "leafB")),
    ]
    fabric = build_fabric(specs, "ib")
    ib = block_build.blocks_from_domains(domains, "n.csv", fabric=fabric).topology
    assert [b.comment.split("cliqueId=")[1] for b in ib.blocks] == ["1", "3", "0", "2"]
    by_name = block_build.blocks_from_domains(domains, "n.csv").topology
    assert [b.comment.split("cliqueId=")[1] for b in by_name.blocks] == ["0", "1", "2", "3"]


def test_blocks_from_leaves() -> None:
    built = block_build.blocks_from_leaves(fat_tree([4, 4, 4, 3]))
    assert [b.name for b in built.topology.blocks] == ["block1", "block2", "block3", "block4"]
    assert built.topology.block_sizes == (3, 6, 12)
    short = block_build.blocks_from_leaves(fat_tree([4, 4, 4, 3]), (4, 8))
    assert len(short.topology.blocks) == 3 and "leaf switch leaf4" in short.skipped[0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no rows"),
        ("gb01, uuid\n", "n.csv:1: expected 3 columns"),
        ("gb01,u1,1\ngb01,u2,1\n", "n.csv:2: node 'gb01' has GPUs in two NVLink domains"),
        ("\rz", "n.csv:2: expected 3 columns"),
        ("gb01," + "x" * 200_000 + ",1\n", "n.csv:1: not valid CSV"),
        ("gb[01,u,1\n", "n.csv:1: bad hostlist"),
    ],
)
def test_bad_nvlink_csv(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        block_build.read_nvlink_csv(text, "n.csv")


def test_no_domain_at_all_is_an_error() -> None:
    with pytest.raises(InputError, match="no node is in an NVLink domain"):
        block_build.blocks_from_domains({}, "n.csv")


@settings(max_examples=3000, deadline=None)
@given(st.text(alphabet=st.sampled_from("gb01,\r\n\"' #[]-xN/A"), max_size=60) | st.text(max_size=40))
def test_nvlink_csv_reader_raises_only_our_errors(text: str) -> None:
    with contextlib.suppress(UserError):
        block_build.read_nvlink_csv(text, "n.csv")
