"""NCCL's interface, HCA and GID settings against a node's sysfs (issue 24 item 10), on recorded trees."""

from pathlib import Path

from air_hpc.config import load_job
from air_hpc.doctor.container import container_findings
from air_hpc.doctor.nccl import NameList, nccl_findings, suggested_nccl_env
from air_hpc.doctor.node import NodeNetwork, read_node_network
from air_hpc.render import job_environment

REPO = Path(__file__).resolve().parents[2]
TESTBED_JOB = REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml"
H100 = ("hardware=h100-sxm", "resources.tasks_per_node=8", "train.global_batch_size=8", "train.micro_batch_size=1")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _interface(root: Path, name: str, up: bool) -> None:
    _write(root / "class/net" / name / "operstate", "up" if up else "down")
    _write(root / "class/net" / name / "flags", "0x1003" if up else "0x1002")


def _port(root: Path, device: str, active: bool, link: str, gids: dict[int, tuple[str, str]]) -> None:
    port = root / "class/infiniband" / device / "ports/1"
    _write(port / "state", "4: ACTIVE" if active else "1: DOWN")
    _write(port / "link_layer", link)
    for index, (address, kind) in gids.items():
        _write(port / "gids" / str(index), address)
        _write(port / "gid_attrs/types" / str(index), kind)
    _write(port / "gids" / "9", "0000:0000:0000:0000:0000:0000:0000:0000")


ROCE_GIDS = {
    0: ("fe80:0000:0000:0000:0a00:27ff:fe00:0001", "IB/RoCE v1"),
    1: ("fe80:0000:0000:0000:0a00:27ff:fe00:0001", "RoCE v2"),
    2: ("0000:0000:0000:0000:0000:ffff:0a00:0005", "IB/RoCE v1"),
    3: ("0000:0000:0000:0000:0000:ffff:0a00:0005", "RoCE v2"),
}


def roce_node(tmp_path: Path) -> NodeNetwork:
    """bond0 up, eth1 down; mlx5_0 active RoCE, mlx5_1 down; loopback as the kernel shows it."""
    _write(tmp_path / "class/net/lo/operstate", "unknown")
    _write(tmp_path / "class/net/lo/flags", "0x9")
    _interface(tmp_path, "bond0", up=True)
    _interface(tmp_path, "eth1", up=False)
    _interface(tmp_path, "docker0", up=True)
    _port(tmp_path, "mlx5_0", True, "Ethernet", ROCE_GIDS)
    _port(tmp_path, "mlx5_1", False, "Ethernet", ROCE_GIDS)
    return read_node_network(tmp_path, host="gpu01")


def bare_node(tmp_path: Path) -> NodeNetwork:
    """The testbed's kind of machine: eth0 and loopback, no RDMA device."""
    _interface(tmp_path, "eth0", up=True)
    _write(tmp_path / "class/net/lo/operstate", "unknown")
    _write(tmp_path / "class/net/lo/flags", "0x9")
    return read_node_network(tmp_path, host="login1")


def test_sysfs_is_read_as_the_kernel_writes_it(tmp_path: Path) -> None:
    node = roce_node(tmp_path)
    assert {i.name: i.up for i in node.interfaces} == {"bond0": True, "docker0": True, "eth1": False, "lo": True}
    active = [p for p in node.ports if p.active]
    assert [(p.device, p.port, p.roce) for p in active] == [("mlx5_0", 1, True)]
    assert [g.index for g in active[0].gids if g.routable] == [3]  # the empty slot 9 is not a GID
    assert read_node_network(tmp_path / "missing", host="x").ports == ()


def test_a_preset_written_for_another_site_is_named_on_a_bare_node(tmp_path: Path) -> None:
    env = job_environment(load_job(TESTBED_JOB, H100))
    found = nccl_findings(env, bare_node(tmp_path), "cuda", on_compute_node=False)
    messages = {f.key: f.message for f in found}
    assert {f.severity for f in found} == {"warning"}
    assert messages["NCCL_SOCKET_IFNAME"].startswith(
        "'=bond0' selects no interface that is up (up: eth0, lo) on login1"
    )
    assert "where doctor ran" in messages["NCCL_SOCKET_IFNAME"]
    hca = [f.message for f in found if f.key == "NCCL_IB_HCA"]
    assert hca[0].startswith("names mlx5_0, mlx5_3, mlx5_4, mlx5_5, mlx5_6, mlx5_9, mlx5_10, mlx5_11, which this node")
    assert "no active RDMA port: NCCL would carry inter-node traffic over TCP sockets" in hca[1]


def test_inside_an_allocation_the_findings_are_errors(tmp_path: Path) -> None:
    found = nccl_findings({"NCCL_SOCKET_IFNAME": "=ib0"}, bare_node(tmp_path), "cpu", on_compute_node=True)
    assert [(f.severity, f.message) for f in found] == [
        ("error", "'=ib0' selects no interface that is up (up: eth0, lo) on login1")
    ]


def test_matching_settings_pass_and_a_wrong_gid_index_names_the_routable_one(tmp_path: Path) -> None:
    node = roce_node(tmp_path)
    good = {"NCCL_SOCKET_IFNAME": "bond", "NCCL_IB_HCA": "=mlx5_0:1", "NCCL_IB_GID_INDEX": "3"}
    assert nccl_findings(good, node, "cuda", on_compute_node=True) == []
    found = nccl_findings({**good, "NCCL_IB_GID_INDEX": "1"}, node, "cuda", on_compute_node=True)
    assert [f.message for f in found] == [
        "mlx5_0:1 GID 1 is RoCE v2 fe80:0000:0000:0000:0a00:27ff:fe00:0001; routable RoCE v2 GIDs there: 3 on gpu01"
    ]
    down = nccl_findings({"NCCL_IB_HCA": "=mlx5_1"}, node, "cuda", on_compute_node=True)
    assert [f.message for f in down] == ["names mlx5_1, which has no ACTIVE port on gpu01"]


def test_exclusions_and_a_disabled_ib_follow_nccls_rules(tmp_path: Path) -> None:
    node = roce_node(tmp_path)
    assert nccl_findings({"NCCL_SOCKET_IFNAME": "^docker,lo"}, node, "cuda", True) == []
    found = nccl_findings({"NCCL_IB_HCA": "^mlx5_0"}, node, "cuda", True)
    assert [f.message for f in found] == ["'^mlx5_0' leaves no active RDMA port (mlx5_0, mlx5_1) on gpu01"]
    assert (
        nccl_findings({"NCCL_IB_HCA": "=mlx5_7", "NCCL_IB_DISABLE": "1"}, bare_node(tmp_path / "b"), "cuda", True) == []
    )
    assert NameList.parse("^=mlx5_1").selects("mlx5_10") and not NameList.parse("mlx5_1").selects("mlx5_2")


def test_what_cluster_init_writes_comes_from_the_node(tmp_path: Path) -> None:
    assert suggested_nccl_env(roce_node(tmp_path)) == {
        "NCCL_SOCKET_IFNAME": "=bond0",
        "NCCL_IB_HCA": "=mlx5_0",
        "NCCL_IB_GID_INDEX": "3",
    }
    assert suggested_nccl_env(bare_node(tmp_path / "bare")) == {"NCCL_SOCKET_IFNAME": "=eth0"}


def test_the_sites_nccl_settings_win_over_the_preset_and_lose_to_the_job() -> None:
    job = load_job(TESTBED_JOB, [*H100, "cluster.nccl_env.NCCL_SOCKET_IFNAME==eth0", "env.NCCL_IB_GID_INDEX=5"])
    env = job_environment(job)
    assert env["NCCL_SOCKET_IFNAME"] == "=eth0"
    assert env["NCCL_IB_GID_INDEX"] == "5"


def test_a_container_job_needs_pyxis_and_enroot() -> None:
    job = load_job(TESTBED_JOB, [*H100, "container.image=nvcr.io/nvidia/pytorch:25.01-py3"])
    found = container_findings(job, pyxis=False, enroot=False, host="login1", on_compute_node=False)
    assert [(f.severity, f.key) for f in found] == [("error", "container.image"), ("warning", "container.image")]
    assert "pyxis SPANK plugin is not loaded" in found[0].message
    assert container_findings(job, pyxis=True, enroot=True, host="gpu01", on_compute_node=True) == []
    assert (
        container_findings(load_job(TESTBED_JOB, H100), pyxis=False, enroot=False, host="x", on_compute_node=True) == []
    )
