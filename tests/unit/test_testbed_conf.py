"""The testbed's pure parts: config rendering, hosts file, argument checks, package detection."""

import os
import subprocess
from pathlib import Path

import pytest

from air_hpc.cli.testbed_cmd import parse_leaves
from air_hpc.errors import TestbedError, UserError
from air_hpc.runtime.rendezvous import MASTER_PORT_SPAN, master_port
from air_hpc.testbed import Testbed, conf
from air_hpc.testbed.cluster import missing_packages, namespace_members
from air_hpc.testbed.ports import PORT_RANGE, free_ports


def layout_and_ports(tmp_path: Path) -> tuple[conf.Layout, conf.Ports]:
    return conf.Layout(tmp_path), conf.Ports(slurmctld=7001, slurmdbd=7002, mariadb=7003, slurmd=(7011, 7012))


def test_slurm_conf_keeps_everything_on_loopback_and_under_the_state_dir(tmp_path: Path) -> None:
    layout, ports = layout_and_ports(tmp_path)
    text = conf.slurm_conf(layout, ports, ["n1", "n2"], "vm", "airtb")
    assert "SlurmctldHost=vm(127.0.0.1)" in text
    assert "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny" in text
    assert f"AuthInfo=socket={tmp_path}/munge/munge.socket,cred_expire=5" in text
    assert "FirstJobId=5001" in text, "job ids start from the controller port, so side-by-side testbeds differ"
    assert conf.first_job_id(7001) != conf.first_job_id(7002)
    assert "SchedulerParameters=sched_interval=2,bf_interval=2" in text
    assert "TopologyPlugin=topology/tree" in text
    assert "NodeName=n1 NodeHostname=vm NodeAddr=127.0.0.1 Port=7011" in text
    assert "NodeName=n2 NodeHostname=vm NodeAddr=127.0.0.1 Port=7012" in text
    paths = [v for line in text.splitlines() for v in line.split("=")[1:] if v.startswith("/")]
    assert paths and all(p.startswith(str(tmp_path)) or p == "/bin/true" for p in paths)


def test_cloud_conf_keeps_its_controller_on_loopback_under_its_workdir(tmp_path: Path) -> None:
    text = conf.cloud_slurm_conf(tmp_path, ["c3", "c1", "c2", "c10"], "vm", [7001, 7002], ["Extra=1"])
    assert "SlurmctldHost=vm(127.0.0.1)" in text and "SlurmctldPort=7001" in text and "SlurmdPort=7002" in text
    assert "AuthType=auth/none" in text and "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny" in text
    assert text.splitlines()[-3:] == [
        "NodeName=c[1-3,10] CPUs=1 State=CLOUD",
        "PartitionName=all Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        "Extra=1",
    ]
    paths = [v for line in text.splitlines() for v in line.split("=")[1:] if v.startswith("/")]
    assert paths and all(p.startswith(str(tmp_path)) or p == "/bin/true" for p in paths)


def test_both_confs_come_from_one_writer_over_one_loopback_base(tmp_path: Path) -> None:
    layout, ports = layout_and_ports(tmp_path)
    for text in (
        conf.slurm_conf(layout, ports, ["n1", "n2"], "vm", "airtb"),
        conf.cloud_slurm_conf(tmp_path, ["c1"], "vm", [7001, 7002]),
    ):
        keys = [line.split("=", 1)[0] for line in text.splitlines() if not line.startswith(("#", "NodeName=", "Part"))]
        assert len(keys) == len(set(keys)), "a setting written twice"
        base = conf.loopback_controller("x", "vm", 7001)
        assert set(base) - {"ClusterName"} <= set(keys)
        assert {f"{k}={v}" for k, v in base.items() if k != "ClusterName"} <= set(text.splitlines())


def test_slurmdbd_conf_points_at_the_private_mariadb(tmp_path: Path) -> None:
    layout, ports = layout_and_ports(tmp_path)
    text = conf.slurmdbd_conf(layout, ports)
    assert "DbdAddr=127.0.0.1" in text and "DbdPort=7002" in text
    assert "StorageHost=127.0.0.1" in text and "StoragePort=7003" in text


def test_hosts_file_maps_every_node_to_loopback() -> None:
    text = conf.hosts_file(["n1", "n2"], "vm")
    assert text.splitlines()[0] == "127.0.0.1 localhost n1 n2 vm"


@pytest.mark.parametrize("value", ["", "2,,4", "a,b", "2,0"])
def test_bad_leaves_are_user_errors(value: str) -> None:
    with pytest.raises(UserError, match="--leaves"):
        parse_leaves(value)


def test_leaves_parse() -> None:
    assert parse_leaves("2,4,2") == (2, 4, 2)


def test_missing_packages_are_named(tmp_path: Path) -> None:
    assert missing_packages(str(tmp_path)) == sorted(
        {"munge", "mariadb-server", "slurmdbd", "slurmctld", "slurmd", "slurm-client", "util-linux"}
    )


def test_free_ports_are_distinct_and_below_the_ephemeral_range() -> None:
    ports = free_ports(20)
    assert len(set(ports)) == 20
    assert all(PORT_RANGE[0] <= p <= PORT_RANGE[1] < 32768 for p in ports)


def test_no_daemon_port_can_be_a_jobs_rendezvous_port() -> None:
    """A daemon holding the MASTER_PORT a job id maps to would fail that job's rank 0 with EADDRINUSE."""
    job_ports = {master_port(job_id) for job_id in range(MASTER_PORT_SPAN)}
    assert not job_ports & set(range(PORT_RANGE[0], PORT_RANGE[1] + 1))
    assert all(p not in job_ports for p in free_ports(50))


def test_namespace_members_finds_by_key_skips_the_unreadable_and_never_this_process() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert [p.pid for p in namespace_members(lambda pid: pid, child.pid)] == [child.pid]
        assert os.getpid() not in {p.pid for p in namespace_members(lambda pid: "same", "same")}

        def unreadable(pid: int) -> str:
            raise PermissionError(pid)

        assert namespace_members(unreadable, "x") == []
    finally:
        child.kill()
        child.wait()


def test_status_and_down_of_a_testbed_that_never_ran(tmp_path: Path) -> None:
    bed = Testbed(tmp_path)
    assert bed.status()["up"] is False
    assert bed.down() == []


def test_unreadable_state_is_reported(tmp_path: Path) -> None:
    (tmp_path / "testbed.json").write_text("{not json")
    with pytest.raises(TestbedError, match="unreadable testbed state"):
        Testbed(tmp_path).status()


def test_batch_is_preempted_by_urgent_with_the_configured_grace(tmp_path: Path) -> None:
    layout, ports = layout_and_ports(tmp_path)
    text = conf.slurm_conf(layout, ports, ["n1", "n2"], "vm", "airtb", conf.Settings(preempt_grace_s=12))
    assert "PreemptType=preempt/partition_prio" in text and "PreemptMode=REQUEUE" in text
    assert "PartitionName=batch Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 " in text
    assert "PreemptMode=REQUEUE GraceTime=12" in text
    assert "PartitionName=urgent Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF" in text
    assert "preempt_send_user_signal" not in text
    assert "SlurmctldParameters=preempt_send_user_signal" in conf.slurm_conf(
        layout, ports, ["n1", "n2"], "vm", "airtb", conf.Settings(preempt_send_user_signal=True)
    )
    assert "GraceTime=30" in conf.slurm_conf(layout, ports, ["n1", "n2"], "vm", "airtb")


def test_the_testbed_partitions_as_slurm_reports_them() -> None:
    """Real ``scontrol --oneliner show partition`` of a testbed: batch (default, REQUEUE, 30 s grace) and urgent."""
    from air_hpc.slurm.cluster import parse_partitions

    text = (Path(__file__).resolve().parents[1] / "data" / "slurm" / "testbed-partitions.txt").read_text()
    batch, urgent = parse_partitions(text)
    assert (batch.name, batch.default, batch.preempt_mode, batch.grace_time_s) == ("batch", True, "REQUEUE", 30)
    assert (urgent.name, urgent.default, urgent.preempt_mode, urgent.grace_time_s) == ("urgent", False, "OFF", 0)


def test_negative_grace_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TestbedError, match=r"testbed\.preempt_grace_s"):
        Testbed(tmp_path).up(settings=conf.Settings(preempt_grace_s=-1))


def test_negative_grace_on_the_command_line_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from air_hpc.cli.main import main

    with pytest.raises(SystemExit) as info:
        main(["testbed", "up", "--state-dir", str(tmp_path), "--preempt-grace-s", "-1"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--preempt-grace-s" in err and "-1" in err and "Traceback" not in err


def test_a_state_dir_too_deep_for_slurmds_step_sockets_is_refused_with_the_room_there_is(tmp_path: Path) -> None:
    """A deep state dir left the README's job 'launch failed requeued held' (slurmd: socket path 113 > 108)."""
    assert conf.step_socket_overflow(conf.Layout(Path("/tmp/air-hpc-test-abcdef")), ["n1", "n8"]) is None
    deep = conf.Layout(Path("/tmp/pytest-of-root/pytest-224/test_the_readme_block_runs_in_0/state/air-hpc/testbed"))
    why = conf.step_socket_overflow(deep, ["n1", "n12"])
    assert why is not None
    assert why.startswith(f"testbed state dir {deep.root} is too long for slurmd's step sockets")
    room = int(why.rsplit("at most ", 1)[1].split()[0])
    fits = conf.Layout(Path("/" + "d" * (room - 1)))
    assert conf.step_socket_overflow(fits, ["n1", "n12"]) is None
    assert conf.step_socket_overflow(conf.Layout(Path("/" + "d" * room)), ["n1", "n12"]) is not None


def test_a_further_cluster_has_its_own_controller_and_files_and_shares_munge_and_slurmdbd(tmp_path: Path) -> None:
    """``up --clusters 2``: the second cluster's slurm.conf differs in name, ports, nodes and files only."""
    lay = conf.Layout(tmp_path)
    member = lay.member("airtbb")
    assert member.root == tmp_path / "airtbb" and member.slurm_conf == tmp_path / "airtbb" / "etc" / "slurm.conf"
    assert member.munge_socket == lay.munge_socket and member.hosts == lay.hosts
    ports = conf.Ports(slurmctld=7001, slurmdbd=7002, mariadb=7003, slurmd=(7010, 7011))
    text = conf.slurm_conf(member, ports, ["b1", "b2"], "host", "airtbb")
    assert text.startswith(f"# {conf.MEMBER_CONF_HEADER}\n")
    assert "ClusterName=airtbb\n" in text and "AccountingStoragePort=7002\n" in text
    assert f"StateSaveLocation={member.ctld_state}\n" in text and f"socket={lay.munge_socket}," in text
    assert "NodeName=b1 " in text and "NodeName=n1" not in text
    member.etc.mkdir(parents=True)
    member.slurm_conf.write_text(text)
    assert conf.testbed_of(member.slurm_conf) is None  # its $SLURM_CONF is not the testbed's own


def test_more_clusters_than_two_or_beside_tenants_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TestbedError, match="1 or 2 clusters"):
        Testbed(tmp_path).up((2,), settings=conf.Settings(clusters=3))
    with pytest.raises(TestbedError, match="tenants are set up on one cluster"):
        Testbed(tmp_path).up((2,), settings=conf.Settings(clusters=2, tenants=True))
