"""Topology against real Slurm: hostlists vs scontrol, importer output loaded by slurmctld, live node state.

The controller is a throw-away slurmctld of power-saved CLOUD nodes on loopback
(:class:`~air_hpc.testbed.cloud.CloudController`); it needs no slurmd and no
munge, starts in about a second, and is stopped by the test that started it.
"""

import json
import random
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from air_hpc.cli.main import main
from air_hpc.slurm import hostlist
from air_hpc.slurm.client import SlurmClient
from air_hpc.slurm.nodes import SINFO_ARGS, fetch_node_states, parse_sinfo
from air_hpc.testbed.cloud import CloudController
from air_hpc.testbed.ports import PORT_RANGE
from air_hpc.topology import treeconf
from air_hpc.topology.fabric import Fabric
from air_hpc.topology.ibnetdiscover import import_ibnetdiscover
from air_hpc.topology.select import select_nodes
from tests.integration.matrix import matrix_build

pytestmark = pytest.mark.integration

DATA = Path(__file__).parent.parent / "data" / "topology"


# ------------------------------------------------------------------ hostlists vs scontrol
def expressions(rng: random.Random, count: int) -> Iterator[str]:
    """Hostlist expressions with zero padding, several ranges and several prefixes, never naming a host twice."""
    prefixes = ["n", "gpu", "dgx-a09-", "node_", "cn", "x1c"]
    for _ in range(count):
        parts = []
        for prefix in rng.sample(prefixes, rng.randint(1, 3)):
            width = rng.choice([1, 1, 2, 3, 4])
            numbers = sorted(rng.sample(range(10 ** min(width, 3)), rng.randint(1, 6)))
            ranges, start = [], numbers[0]
            for prev, cur in zip(numbers, [*numbers[1:], None], strict=True):
                if cur is not None and cur == prev + 1 and rng.random() < 0.8:
                    continue
                lo, hi = f"{start:0{width}d}", f"{prev:0{width}d}"
                ranges.append(lo if start == prev else f"{lo}-{hi}")
                start = cur if cur is not None else start
            rng.shuffle(ranges)
            if len(ranges) == 1 and "-" not in ranges[0] and rng.random() < 0.5:
                parts.append(f"{prefix}{ranges[0]}")
            else:
                parts.append(f"{prefix}[{','.join(ranges)}]")
        yield ",".join(parts)


def test_hostlists_match_scontrol(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=hostlists\nSlurmctldHost=localhost\n")
    client = SlurmClient(env={"SLURM_CONF": str(conf)}, retries=0)

    def scontrol(*args: str) -> str:
        return client.run(["scontrol", "show", *args]).stdout.strip()

    exact = 0
    cases = list(expressions(random.Random(7), 150))
    for expr in cases:
        ours = hostlist.expand(expr, "generated")
        assert ours == scontrol("hostnames", expr).splitlines(), expr
        compressed = hostlist.compress(ours)
        # Slurm reads our compression back to the same hosts (what matters for topology.conf)
        assert sorted(scontrol("hostnames", compressed).splitlines()) == sorted(ours), (expr, compressed)
        # and we read Slurm's compressions, sorted and unsorted, back to the same hosts
        theirs_sorted = scontrol("hostlistsorted", ",".join(ours))
        assert sorted(hostlist.expand(theirs_sorted, "scontrol")) == sorted(ours), (expr, theirs_sorted)
        theirs = scontrol("hostlist", ",".join(ours))
        assert hostlist.expand(theirs, "scontrol") == ours, (expr, theirs)
        exact += compressed == theirs_sorted
    # the strings differ only where Slurm orders mixed zero-padding differently (n[5,01-02] vs n[01-02,5])
    assert exact >= len(cases) // 2


def test_slurm_reads_our_compression_of_names_with_suffixes(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=hostlists\nSlurmctldHost=localhost\n")
    client = SlurmClient(env={"SLURM_CONF": str(conf)}, retries=0)
    rng = random.Random(11)
    for _ in range(40):
        names = {
            f"{rng.choice(['R', 'rack', 'A09-P1-IBLEAF-'])}{rng.randint(0, 30):0{rng.randint(1, 3)}d}"
            f"{rng.choice(['', '-IBSPINE', '-ib', 'x'])}"
            for _ in range(rng.randint(1, 12))
        }
        expr = hostlist.compress(names)
        out = client.run(["scontrol", "show", "hostnames", expr]).stdout.split()
        assert sorted(out) == sorted(names), expr


def test_bad_range_is_rejected_by_both(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=hostlists\nSlurmctldHost=localhost\n")
    result = SlurmClient(env={"SLURM_CONF": str(conf)}, retries=0).run(
        ["scontrol", "show", "hostnames", "n[5-1]"], check=False
    )
    assert "Invalid" in result.stderr + result.stdout
    from air_hpc.errors import InputError

    with pytest.raises(InputError, match="bad hostlist 'n\\[5-1\\]'"):
        hostlist.expand("n[5-1]", "--nodes")


# ------------------------------------------------------------------ importer output in a real slurmctld
def slurm_topology(text: str) -> dict[str, dict[str, str]]:
    """``scontrol show topology`` lines as {switch: {key: value}}."""
    switches = {}
    for line in text.splitlines():
        pairs = dict(re.findall(r"(\w+)=(\S+)", line))
        if "SwitchName" in pairs:
            switches[pairs["SwitchName"]] = pairs
    return switches


def check_loaded(fabric: Fabric, conf_text: str, tmp_path: Path) -> CloudController:
    ctl = CloudController(conf_text, fabric.nodes, tmp_path, build=matrix_build())
    ctl.start()
    try:
        shown = slurm_topology(ctl.show_topology())
        assert set(shown) == set(fabric.switches)
        leaf_nodes: list[str] = []
        for name, pairs in shown.items():
            assert int(pairs["Level"]) == fabric.switches[name].level
            if pairs["Level"] == "0":
                leaf_nodes.extend(hostlist.expand(pairs["Nodes"], "scontrol show topology"))
        assert sorted(leaf_nodes) == sorted(fabric.nodes)
        assert len(leaf_nodes) == len(set(leaf_nodes))
    except BaseException:
        ctl.stop()
        raise
    return ctl


@pytest.fixture(scope="module")
def superpod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fabric, CloudController]]:
    compute = hostlist.expand("dgx-a09-[01-04],dgx-a10-[01-04]", "test")
    result = import_ibnetdiscover((DATA / "dgx-superpod.ibnetdiscover").read_text(), "superpod", compute)
    text = treeconf.render(result.fabric, header="imported by the integration test")
    ctl = check_loaded(result.fabric, text, tmp_path_factory.mktemp("superpod-ctld"))
    try:
        yield result.fabric, ctl
    finally:
        ctl.stop()


def test_multi_rail_import_is_accepted_with_every_node_once(superpod: tuple[Fabric, CloudController]) -> None:
    fabric, _ = superpod
    assert len(fabric.nodes) == 8


def test_the_cloud_controller_listens_on_a_port_from_the_shared_picker(
    superpod: tuple[Fabric, CloudController],
) -> None:
    """Below the ephemeral range, like the testbed's daemons (bind(0) drew one from it: the race)."""
    _, ctl = superpod
    ports = [
        int(line.split("=", 1)[1])
        for line in ctl.conf.read_text().splitlines()
        if line.split("=", 1)[0] in ("SlurmctldPort", "SlurmdPort")
    ]
    assert len(ports) == 2 and all(PORT_RANGE[0] <= p <= PORT_RANGE[1] for p in ports), ports
    assert "is UP" in ctl.client.run(["scontrol", "ping"]).stdout


def test_three_level_import_is_accepted(tmp_path: Path) -> None:
    fabric = import_ibnetdiscover((DATA / "hpc-3level.ibnetdiscover").read_text(), "hpc").fabric
    check_loaded(fabric, treeconf.render(fabric), tmp_path).stop()


def test_live_node_state_and_selection_agree_with_slurm(
    superpod: tuple[Fabric, CloudController],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fabric, ctl = superpod
    ctl.set_unavailable({"dgx-a09-02", "dgx-a10-01", "dgx-a10-02"})
    try:
        states = fetch_node_states(ctl.client)
        assert states.available == set(fabric.nodes) - {"dgx-a09-02", "dgx-a10-01", "dgx-a10-02"}
        assert parse_sinfo(ctl.client.run(list(SINFO_ARGS)).stdout).available == states.available

        for count in (2, 3, 4, 5):
            ours = select_nodes(fabric, set(states.available), count)
            theirs = ctl.placement(count)
            assert theirs is not None
            assert len(ours.leaves) <= len({fabric.leaf_of[n] for n in theirs})
        assert ctl.placement(6) is None

        conf = tmp_path / "topology.conf"
        conf.write_text(treeconf.render(fabric))
        monkeypatch.setenv("SLURM_CONF", str(ctl.conf))
        monkeypatch.setenv("PATH", ctl.client.env["PATH"])  # a Slurm build's commands, when the matrix runs one
        main(["topo", "select", "--topology", str(conf), "-N", "3", "--from-slurm", "--json"])
        data = json.loads(capsys.readouterr().out)
        assert data["nodelist"] == "dgx-a09-[01,03-04]"
        assert data["leaf_switches"] == 1
    finally:
        ctl.set_unavailable(set())
