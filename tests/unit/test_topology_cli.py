"""``air-hpc topo import|show|select`` through the real CLI entry point (error boundary included)."""

import json
from pathlib import Path

import pytest

from air_hpc.cli.main import main
from air_hpc.topology import topoyaml, treeconf
from air_hpc.topology.fabric import Fabric
from air_hpc.topology.synthetic import fat_tree

DATA = Path(__file__).parent.parent / "data" / "topology"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        main(list(argv))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def testbed_conf(tmp_path: Path) -> Path:
    path = tmp_path / "topology.conf"
    path.write_text(treeconf.render(fat_tree([2, 4, 2])))
    return path


def test_import_tree_to_stdout_reports_skips_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        capsys,
        "topo",
        "import",
        "--ibnetdiscover",
        str(DATA / "dgx-superpod.ibnetdiscover"),
        "--nodes",
        "dgx-a09-[01-04],dgx-a10-[01-04]",
    )
    assert code == 0
    fabric = treeconf.parse(out, "stdout")
    assert len(fabric.nodes) == 8
    assert "skipped: host ufm01" in err
    assert "skipped: 21 SHARP aggregation node(s)" in err
    assert "imported 8 compute nodes, 2 leaf switch(es), 2 level(s)" in err


def test_import_block_to_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    csv = tmp_path / "nvlink.csv"
    csv.write_text("".join(f"cn{i:03d}, uuid-a, {(i - 1) // 12}\n" for i in range(1, 25)) + "stray, uuid-a, 9\n")
    target = tmp_path / "block.conf"
    code, out, err = run(
        capsys,
        "topo",
        "import",
        "--ibnetdiscover",
        str(DATA / "hpc-3level.ibnetdiscover"),
        "--format",
        "block",
        "--nvlink-csv",
        str(csv),
        "-o",
        str(target),
    )
    assert code == 0
    assert out == ""
    blocks = treeconf.parse_block(target.read_text(), "block.conf")
    assert [b.nodes[0] for b in blocks.blocks] == ["cn001", "cn013"]
    assert blocks.block_sizes == (12, 24)
    assert "skipped: stray: in" in err


def test_select_json(capsys: pytest.CaptureFixture[str], testbed_conf: Path, tmp_path: Path) -> None:
    busy = tmp_path / "busy.txt"
    busy.write_text("# drained\nn3\n\nn8  # broken\n")
    code, out, _ = run(
        capsys, "topo", "select", "--topology", str(testbed_conf), "-N", "4", "--unavailable-file", str(busy), "--json"
    )
    assert code == 0
    data = json.loads(out)
    assert data["nodelist"] == "n[4-7]"  # leaf2 (3 free) + leaf3 (1 free): a tight fit, leaf1 stays whole
    assert data["leaf_switches"] == 2
    assert {"nodelist", "nodes", "leaf_switches", "switches_by_level", "lower_bound_leaves", "switches_hint"} <= set(
        data
    )
    assert len(data["nodes"]) == 4
    assert not {"n3", "n8"} & set(data["nodes"])
    assert data["switches_by_level"] == [data["leaf_switches"], 1]
    assert data["switches_hint"] == data["leaf_switches"]


def test_select_text(capsys: pytest.CaptureFixture[str], testbed_conf: Path) -> None:
    code, out, _ = run(capsys, "topo", "select", "--topology", str(testbed_conf), "-N", "2", "--unavailable", "n1")
    assert code == 0
    assert "nodelist: n[7-8]" in out
    assert "--switches=1" in out


def test_show_counts_free_and_used(capsys: pytest.CaptureFixture[str], testbed_conf: Path) -> None:
    code, out, _ = run(capsys, "topo", "show", str(testbed_conf), "--unavailable", "n[3-4]")
    assert code == 0
    assert "spine1 (level 1)  free 6/8  used 2" in out
    assert "leaf2 (level 0)  free 2/4  used 2" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["select", "--topology", "{conf}", "-N", "9"], "9 nodes requested but only 8 of 8 are available"),
        (["select", "--topology", "{conf}", "-N", "2", "--unavailable", "n[5-1]"], "--unavailable: bad hostlist"),
        (["select", "--topology", "/nonexistent/topo.conf", "-N", "2"], "--topology: cannot read"),
        (["show", "{bad}"], ":1: cannot parse 'garbage'"),
        (["select", "--topology", "{conf}", "-N", "2", "--unavailable-file", "{busy}"], "busy.txt:2: bad hostlist"),
        (["import", "--ibnetdiscover", "{bad}"], ":1: cannot parse 'SwitchName=x garbage'"),
    ],
)
def test_errors_are_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], testbed_conf: Path, tmp_path: Path, argv: list[str], message: str
) -> None:
    bad = tmp_path / "bad.conf"
    bad.write_text("SwitchName=x garbage\n")
    busy = tmp_path / "busy.txt"
    busy.write_text("n1\nn[3-\n")
    argv = [a.format(conf=testbed_conf, bad=bad, busy=busy) for a in argv]
    code, _, err = run(capsys, "topo", *argv)
    assert code == 2
    assert message in err
    assert err.startswith("error: ")
    assert err.count("\n") == 1


@pytest.fixture
def block_conf(tmp_path: Path) -> Path:
    path = tmp_path / "block.conf"
    lines = [f"BlockName=b{i + 1:02d} Nodes=gb[{i * 18 + 1:03d}-{i * 18 + 18:03d}]" for i in range(16)]
    path.write_text("\n".join(lines) + "\nBlockSizes=18,36,72,144,288\n")
    return path


def test_select_block_json_follows_slurm_rules(capsys: pytest.CaptureFixture[str], block_conf: Path) -> None:
    code, out, _ = run(
        capsys, "topo", "select", "--topology", str(block_conf), "-N", "20", "--unavailable", "gb[001-006]", "--json"
    )
    assert code == 0
    data = json.loads(out)
    assert data["plugin"] == "topology/block"
    assert data["blocks"] == ["b01", "b02"] and data["aggregate_nodes"] == 36
    assert data["whole_blocks_broken"] == 1  # b01's 12 free + 8 of b02
    assert data["sbatch"] == ["--nodes=20", f"--nodelist={data['nodelist']}"]
    assert data["segments"] == [data["nodelist"]]


def test_select_block_segments_text(capsys: pytest.CaptureFixture[str], block_conf: Path) -> None:
    code, out, _ = run(capsys, "topo", "select", "--topology", str(block_conf), "-N", "40", "--segment", "10")
    assert code == 0
    assert "segments: gb[001-010], gb[019-028], gb[037-046], gb[055-064]" in out
    assert "--segment=10" in out


@pytest.mark.parametrize(
    ("text", "argv", "message"),
    [
        (None, ["--segment", "20", "-N", "40"], "block.conf: --segment=20 is larger than the base block size 18"),
        (None, ["--segment", "4", "-N", "30"], "--segment=4 does not divide the job's 30 nodes"),
        ("tree", ["--segment", "2", "-N", "4"], "--segment needs a block topology (BlockName= lines)"),
        ("BlockName=b1 Nodes=n[1-4]\nBlockName=b2 Nodes=n[4-7]\n", ["-N", "2"], ":2: node 'n4' is in both block"),
        ("BlockName=b1 Nodes=n[1-4]\nBlockSizes=4,12\n", ["-N", "2"], ":2: BlockSizes=4,12: 12 is not the base"),
        ("BlockName=b1 Nodes=n[1-4]\nSwitchName=s Nodes=n[5-8]\n", ["-N", "2"], ":2: SwitchName= line in a block"),
        ("SwitchName=s Nodes=n[5-8]\nBlockName=b1 Nodes=n[1-4]\n", ["-N", "2"], ":1: SwitchName= line in a block"),
    ],
)
def test_block_errors_are_one_line_exit_2(
    capsys: pytest.CaptureFixture[str],
    block_conf: Path,
    testbed_conf: Path,
    tmp_path: Path,
    text: str | None,
    argv: list[str],
    message: str,
) -> None:
    path = block_conf
    if text == "tree":
        path = testbed_conf
    elif text is not None:
        path = tmp_path / "other.conf"
        path.write_text(text)
    code, _, err = run(capsys, "topo", "select", "--topology", str(path), *argv)
    assert code == 2
    assert message in err
    assert err.startswith("error: ") and err.count("\n") == 1


def nvl_csv(tmp_path: Path, trays: int = 18, domains: int = 4, missing: tuple[int, ...] = ()) -> Path:
    path = tmp_path / "nvlink.csv"
    rows = [
        f"gb{d * trays + t + 1:03d}, uuid-a, {d}\n"
        for d in range(domains)
        for t in range(trays)
        if d * trays + t + 1 not in missing
    ]
    path.write_text("hostname, fabric.clusterUuid, fabric.cliqueId\n" + "".join(rows))
    return path


def test_block_file_from_the_nvlink_csv_alone(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    csv = nvl_csv(tmp_path, missing=(20,))
    code, out, err = run(capsys, "topo", "import", "--format", "block", "--nvlink-csv", str(csv))
    assert code == 0
    blocks = treeconf.parse_block(out, "out.conf")
    assert blocks.block_sizes == (18, 36)  # not 17: the short domain is left out
    assert "gb[019,021-036]" in err and "17 node(s)" in err
    assert "no --ibnetdiscover: blocks ordered by hostname" in err


def test_block_sizes_option(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    csv = nvl_csv(tmp_path)
    code, out, _ = run(
        capsys, "topo", "import", "--format", "block", "--nvlink-csv", str(csv), "--block-sizes", "18,72"
    )
    assert code == 0 and "BlockSizes=18,72" in out
    code, _, err = run(
        capsys, "topo", "import", "--format", "block", "--nvlink-csv", str(csv), "--block-sizes", "18,54"
    )
    assert code == 2 and "--block-sizes: BlockSizes=18,54: 54 is not the base block size 18" in err
    code, _, err = run(capsys, "topo", "import", "--format", "block", "--nvlink-csv", str(csv), "--block-sizes", "x")
    assert code == 2 and "expected comma-separated node counts" in err


def test_blocks_from_ib_leaves_warn(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        capsys, "topo", "import", "--ibnetdiscover", str(DATA / "hpc-3level.ibnetdiscover"), "--format", "block"
    )
    assert code == 0 and "BlockName=block1" in out
    assert "warning: no --nvlink-csv: one block per IB leaf switch" in err


def test_yaml_output_round_trips_and_selects(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    capture = DATA / "hpc-3level.ibnetdiscover"
    code, tree_text, _ = run(capsys, "topo", "import", "--ibnetdiscover", str(capture))
    assert code == 0
    nodes = treeconf.parse(tree_text, "t").nodes
    csv = tmp_path / "nvlink.csv"
    csv.write_text("".join(f"{n}, uuid, {i // 4}\n" for i, n in enumerate(nodes)))
    target = tmp_path / "topology.yaml"
    code, _, err = run(
        capsys,
        "topo",
        "import",
        "--ibnetdiscover",
        str(capture),
        "--nvlink-csv",
        str(csv),
        "--format",
        "yaml",
        "-o",
        str(target),
    )
    assert code == 0, err
    named = topoyaml.parse(target.read_text(), "topology.yaml")
    assert [(t.name, t.cluster_default) for t in named] == [("block", True), ("tree", False)]
    tree = named[1].topology
    assert isinstance(tree, Fabric) and tree.nodes == treeconf.parse(tree_text, "t").nodes
    code, out, _ = run(capsys, "topo", "select", "--topology", str(target), "-N", "8", "--segment", "4", "--json")
    assert code == 0 and json.loads(out)["plugin"] == "topology/block"


def test_import_needs_a_source(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "topo", "import")
    assert code == 2 and "give --ibnetdiscover FILE" in err
    code, _, err = run(capsys, "topo", "import", "--nvlink-csv", str(nvl_csv(tmp_path)))
    assert code == 2 and "--format tree needs --ibnetdiscover" in err
