"""ibnetdiscover import on realistic captures (tests/data/topology, see make_captures.py) and on bad input."""

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from air_hpc.errors import TopologyError
from air_hpc.slurm import hostlist
from air_hpc.topology import treeconf
from air_hpc.topology.ibnetdiscover import host_name, import_ibnetdiscover, switch_name

DATA = Path(__file__).parent.parent / "data" / "topology"
SUPERPOD = (DATA / "dgx-superpod.ibnetdiscover").read_text()
THREE_LEVEL = (DATA / "hpc-3level.ibnetdiscover").read_text()
COMPUTE = hostlist.expand("dgx-a09-[01-04],dgx-a10-[01-04]", "test")


def test_switch_and_host_names() -> None:
    assert switch_name("MF0;A09-P1-IBLEAF-04-04:MQM9701/U1", "S-fc6a") == "A09-P1-IBLEAF-04-04"
    assert switch_name("Quantum Mellanox Technologies", "S-FC6A1C") == "sw-fc6a1c"
    assert switch_name("MF0;MQM9700/U1", "S-ab12") == "sw-ab12"
    assert switch_name("ib leaf 7", "S-1") == "ib-leaf-7"
    assert host_name("dgx-a09-01.cluster.local mlx5_0") == "dgx-a09-01"


def test_superpod_multi_rail_becomes_one_logical_leaf_per_scalable_unit() -> None:
    result = import_ibnetdiscover(SUPERPOD, "superpod", COMPUTE)
    fabric = result.fabric
    assert fabric.leaves == ("A09-P1-IBLEAF-01", "A10-P1-IBLEAF-02")
    assert fabric.roots == ("A11-P1-IBSPINE-01",)
    assert fabric.height == 2
    assert fabric.switches["A09-P1-IBLEAF-01"].nodes == tuple(COMPUTE[:4])
    assert fabric.switches["A10-P1-IBLEAF-02"].nodes == tuple(COMPUTE[4:])
    assert sorted(fabric.nodes) == sorted(COMPUTE)
    assert "8 rail leaves serving the same 4 nodes (A09-P1-IBLEAF-01-[01-08])" in (
        fabric.switches["A09-P1-IBLEAF-01"].comment
    )
    assert "4 parallel switches (A11-P1-IBSPINE-01-[01-04])" in fabric.switches["A11-P1-IBSPINE-01"].comment
    text = treeconf.render(fabric)
    assert "SwitchName=A09-P1-IBLEAF-01 Nodes=dgx-a09-[01-04]\n" in text
    assert "SwitchName=A11-P1-IBSPINE-01 Switches=A09-P1-IBLEAF-01,A10-P1-IBLEAF-02\n" in text
    assert "# logical leaf A09-P1-IBLEAF-01" in text


def test_superpod_reports_every_skip() -> None:
    result = import_ibnetdiscover(SUPERPOD, "superpod", COMPUTE)
    skipped = "\n".join(result.skipped)
    assert "21 SHARP aggregation node(s)" in skipped
    for host in ("login01", "login02", "ufm01", "ufm02"):
        assert f"host {host} on" in skipped
    assert "HCA H-b8cef60303000000 (MT4129 ConnectX7 Mellanox Technologies)" in skipped
    assert "switch sw-fc6a1c0300000200: no compute nodes attached" in skipped
    notes = "\n".join(result.notes)
    assert "dgx-a10-02 (same system image GUID)" in notes
    assert "on A09-P1-IBLEAF-01-06 port 3: dgx-a09-03 (same port on the other rails)" in notes


def test_superpod_without_filter_keeps_hosts_and_the_management_leaf() -> None:
    fabric = import_ibnetdiscover(SUPERPOD, "superpod").fabric
    assert "login01" in fabric.switches["A09-P1-IBLEAF-01"].nodes
    assert fabric.switches["sw-fc6a1c0300000200"].nodes == ("ufm01", "ufm02")


def test_node_pattern_filters_like_a_hostlist() -> None:
    by_pattern = import_ibnetdiscover(SUPERPOD, "superpod", node_pattern=r"dgx-.*").fabric
    assert sorted(by_pattern.nodes) == sorted(COMPUTE)


def test_listed_node_missing_from_capture_is_reported() -> None:
    result = import_ibnetdiscover(SUPERPOD, "superpod", [*COMPUTE, "dgx-a11-01"])
    assert any("not in the capture: dgx-a11-01" in line for line in result.skipped)


def test_ports_format_gives_the_same_fabric() -> None:
    ports = (DATA / "dgx-superpod-ports.ibnetdiscover").read_text()
    default = import_ibnetdiscover(SUPERPOD, "superpod", COMPUTE)
    result = import_ibnetdiscover(ports, "superpod-p", COMPUTE)
    assert treeconf.render(result.fabric) == treeconf.render(default.fabric)
    # without system image GUIDs the unnamed rail of dgx-a10-02 is found through the other rails
    assert any("dgx-a10-02 (same port on the other rails)" in note for note in result.notes)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("SW 2 1 0x0001 4x NDR - XX 3 1 0x0002 ( 'a' - 'b' )\n", "p:1: cannot parse"),
        (
            "SW 2 1 0x0001 4x NDR - CA 3 1 0x0002 ( 'leaf' - 'n1 mlx5_0' )\n"
            "SW 2 1 0x0001 4x NDR - CA 4 1 0x0003 ( 'leaf' - 'n2 mlx5_0' )\n",
            "p:2: port 1 of S-0001 linked twice",
        ),
    ],
)
def test_bad_ports_format(text: str, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        import_ibnetdiscover(text, "p")


def test_three_level_tree_groups_parallel_spines_and_cores() -> None:
    result = import_ibnetdiscover(THREE_LEVEL, "hpc")
    fabric = result.fabric
    assert fabric.height == 3
    assert fabric.roots == ("R00-IBCORE",)
    assert fabric.switches["R00-IBCORE"].children == ("R01-IBSPINE", "R02-IBSPINE")
    assert fabric.switches["R01-IBSPINE"].children == ("R01-IBLEAF-01", "R01-IBLEAF-02")
    assert fabric.switches["R02-IBLEAF-01"].nodes == tuple(f"cn{i:03d}" for i in range(13, 19))
    assert len(fabric.nodes) == 24
    assert result.skipped == ()


def _move_rail(capture: str, host_hca: str, new_leaf: str, new_port: int) -> str:
    """Re-cable one HCA port (both directions) to another leaf: a miscabled rail."""
    lines = capture.splitlines()
    out = []
    for line in lines:
        if line.startswith(f"[1]({host_hca})"):
            line = f'[1]({host_hca}) \t"S-{new_leaf}"[{new_port}]\t\t# miscabled'
        elif f'"H-{host_hca}"[1]' in line:
            continue
        out.append(line)
    return "\n".join(out)


def test_miscabled_rail_keeps_the_node_under_its_majority_leaf() -> None:
    # dgx-a09-02 rail 3 (mlx5_3) plugged into the other unit's rail-3 leaf
    capture = _move_rail(SUPERPOD, "b8cef60300010203", "fc6a1c0300000022", 40)
    result = import_ibnetdiscover(capture, "miscabled", COMPUTE)
    assert result.fabric.leaf_of["dgx-a09-02"] == "A09-P1-IBLEAF-01"
    assert result.fabric.leaves == ("A09-P1-IBLEAF-01", "A10-P1-IBLEAF-02")
    assert any("dgx-a09-02: rails on 2 leaf groups (miscabled?)" in note for note in result.notes)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "cap: no Switch or Ca entries"),
        ("# just comments\n\n", "cap: no Switch or Ca entries"),
        ("vendid=0x2c9\nthis is not ibnetdiscover\n", "cap:2: cannot parse 'this is not ibnetdiscover'"),
        ('[1]\t"S-0001"[2]\t\t# "x" lid 1 4xNDR\n', "cap:1: port line outside a Switch/Ca block"),
        (
            'Switch\t36 "S-0001"\t\t# "MF0;leaf:MQM8700/U1" enhanced port 0 lid 1 lmc 0\n'
            '[1]\t"H-0002"[1](0002)\t\t# "n1 mlx5_0" lid 2 4xHDR\n',
            "cap:2: link to H-0002, which the capture never defines",
        ),
        (
            'Switch\t36 "S-0001"\t\t# "a" enhanced port 0 lid 1 lmc 0\nSwitch\t36 "S-0001"\t\t# "a"\n',
            "cap:2: device S-0001 defined twice",
        ),
    ],
)
def test_bad_captures_name_file_and_line(text: str, message: str) -> None:
    with pytest.raises(TopologyError, match=message) as info:
        import_ibnetdiscover(text, "cap")
    assert info.value.exit_code == 2


def test_no_compute_nodes_is_an_error() -> None:
    with pytest.raises(TopologyError, match="superpod: no compute nodes found"):
        import_ibnetdiscover(SUPERPOD, "superpod", ["nonexistent"])


def test_bad_node_pattern() -> None:
    with pytest.raises(TopologyError, match="bad --node-pattern"):
        import_ibnetdiscover(SUPERPOD, "superpod", node_pattern="dgx-[")


@given(
    st.integers(min_value=0, max_value=len(THREE_LEVEL.splitlines())),
    st.text(alphabet=st.characters(codec="ascii", exclude_characters="\r\x0b\x0c\x1c\x1d\x1e\x85\n"), max_size=60),
)
@settings(max_examples=150, deadline=None)
def test_any_inserted_line_is_understood_or_named(position: int, line: str) -> None:
    lines = THREE_LEVEL.splitlines()
    lines.insert(position, line)
    try:
        result = import_ibnetdiscover("\n".join(lines), "fuzz.ibnet")
    except TopologyError as exc:
        assert str(exc).startswith("fuzz.ibnet")
    else:
        assert len(result.fabric.nodes) == len(set(result.fabric.nodes))
