"""Cluster probing (doctor, cluster init): parsers on recorded slurmctld output, findings, the CLI on the fake."""

import json
from pathlib import Path

import pytest
import yaml

from air_hpc.cli.main import cli, main
from air_hpc.config import load_job
from air_hpc.doctor.checks import cluster_findings, job_findings
from air_hpc.doctor.nccl import suggested_nccl_env
from air_hpc.doctor.node import read_node_network
from air_hpc.errors import ConfigError, SlurmError
from air_hpc.slurm.cluster import (
    gpus_in_gres,
    parse_minutes,
    parse_partitions,
    parse_show_config,
    parse_sinfo_groups,
    parse_topology,
)
from air_hpc.slurm.fake import FakeClusterText, FakeSlurm
from air_hpc.slurm.survey import probe_cluster

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "slurm"
TESTBED_JOB = REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml"
#: gpt-tiny laid out for 8 GPUs per node: 2 nodes x 8 ranks, TP2 x PP2, DP4; the recorded GPU nodes
#: have 16 cores, so two per rank (not the preset's 112 over 8).
GPU_JOB = (
    "hardware=h100-sxm",
    "resources.tasks_per_node=8",
    "resources.cpus_per_task=2",
    "train.global_batch_size=8",
    "train.micro_batch_size=1",
)


def recorded(kind: str, accounts: tuple[str, ...] = ("root",), conf_dir: Path | None = None) -> FakeClusterText:
    """What a real slurmctld 22.05 printed: ``testbed`` (the embedded testbed) or ``gpu-preempt``
    (a CLOUD-node controller with GPU gres, partition_prio preemption and preempt_send_user_signal).

    Its paths were rewritten to /srv/recorded/KIND; ``conf_dir`` moves slurm.conf's directory there.
    """
    config = (DATA / f"{kind}-show-config.txt").read_text()
    if conf_dir is not None:
        config = config.replace(f"/srv/recorded/{kind}", str(conf_dir))
    return FakeClusterText(
        config=config,
        partitions=(DATA / f"{kind}-partitions.txt").read_text(),
        sinfo=(DATA / f"{kind}-sinfo.txt").read_text(),
        topology=(DATA / f"{kind}-topology.txt").read_text(),
        default_account=accounts[0] if accounts else None,
        accounts=accounts,
    )


@pytest.mark.parametrize(
    ("text", "minutes"),
    [
        ("UNLIMITED", None),
        ("infinite", None),
        ("30", 30),
        ("30:00", 30),
        ("30:01", 31),
        ("04:00:00", 240),
        ("1-00:00:00", 1440),
        ("2-12", 3600),
        ("1-01:30", 1530),
    ],
)
def test_parse_minutes_reads_every_slurm_time_form(text: str, minutes: int | None) -> None:
    assert parse_minutes(text) == minutes


def test_parse_minutes_rejects_garbage() -> None:
    with pytest.raises(SlurmError, match="time limit 'soon'"):
        parse_minutes("soon")


@pytest.mark.parametrize(
    ("gres", "gpus"),
    [
        ("(null)", 0),
        ("gpu:8", 8),
        ("gpu:h100:8(S:0-1)", 8),
        ("gpu:a100:2(S:0,1),gpu:v100:2", 4),
        ("shard:32,gpu:h200:4", 4),
        ("nic:mlx5:8", 0),
    ],
)
def test_gpus_in_gres(gres: str, gpus: int) -> None:
    assert gpus_in_gres(gres) == gpus


def test_show_config_of_the_testbed() -> None:
    s = parse_show_config((DATA / "testbed-show-config.txt").read_text())
    assert (s.version, s.cluster_name, s.select_type) == ("22.05.8", "airtb", "select/cons_tres")
    assert s.topology_plugin == "topology/tree" and s.job_requeue
    assert not s.preemption_enabled and s.preempt_type is None
    assert s.accounting_storage == "accounting_storage/slurmdbd"
    assert dict(s.controllers) == {"primary": "UP"}
    assert s.kill_wait_s == 5 and s.max_batch_requeue is None


def test_show_config_with_preemption_and_gres() -> None:
    s = parse_show_config((DATA / "gpu-preempt-show-config.txt").read_text())
    assert s.preempt_type == "preempt/partition_prio" and s.preempt_mode == "REQUEUE"
    assert s.preemption_enabled and s.preempt_send_user_signal
    assert s.gres_types == ("gpu",) and not s.job_requeue
    assert s.accounting_storage is None


def test_show_config_reads_only_its_first_section() -> None:
    """Newer Slurm appends cgroup and MPI sections after a blank line; their keys must not leak in."""
    text = (
        (DATA / "testbed-show-config.txt")
        .read_text()
        .replace(
            "\nSlurmctld(primary)",
            "\nCgroup Support Configuration:\nSLURM_VERSION = 99\nMaxBatchRequeue = 1\n\nSlurmctld(primary)",
        )
    )
    s = parse_show_config(text)
    assert s.version == "22.05.8" and s.max_batch_requeue is None


def test_show_config_rejects_other_text() -> None:
    with pytest.raises(SlurmError, match="no SLURM_VERSION"):
        parse_show_config("PartitionName=debug Nodes=n1\n")


def test_partitions_and_node_groups() -> None:
    parts = {p.name: p for p in parse_partitions((DATA / "gpu-preempt-partitions.txt").read_text())}
    assert set(parts) == {"all", "gpu", "urgent"}
    gpu = parts["gpu"]
    assert (gpu.max_time_min, gpu.max_nodes, gpu.total_nodes, gpu.grace_time_s) == (240, 2, 4, 30)
    assert parts["urgent"].max_time_min == 1440 and parts["urgent"].preempt_mode == "OFF"
    assert parts["all"].default and parts["all"].max_time_min is None
    groups = parse_sinfo_groups((DATA / "gpu-preempt-sinfo.txt").read_text())
    assert [g.gpus for g in groups["all"]] == [0, 8]
    assert groups["gpu"][0].cpus == 16 and groups["gpu"][0].mem_mb == 64000


def test_partition_and_sinfo_parsers_name_the_bad_line() -> None:
    with pytest.raises(SlurmError, match=r"scontrol show partition:1: expected 'PartitionName"):
        parse_partitions("Nodes=n1 State=UP\n")
    with pytest.raises(SlurmError, match=r"sinfo:2: expected 'PARTITION\|NODES"):
        parse_sinfo_groups("debug|8|4|4096|(null)\ndebug 8\n")


def test_topology_counts_leaves() -> None:
    assert parse_topology((DATA / "testbed-topology.txt").read_text()) == (3, 4)
    assert parse_topology("BlockName=b1 Nodes=n[1-4]\nBlockName=b2 Nodes=n[5-8]\n") == (2, 2)


def test_probe_keeps_going_without_accounting() -> None:
    facts = probe_cluster(FakeSlurm(cluster=recorded("testbed", accounts=())), "alice")
    assert not facts.accounting.available or facts.accounting.default_account is None
    assert facts.partition(None) is not None and facts.partition(None).name == "batch"  # type: ignore[union-attr]


def test_a_fitting_job_has_no_findings() -> None:
    facts = probe_cluster(FakeSlurm(cluster=recorded("testbed")), "root")
    job = load_job(TESTBED_JOB, [f"cluster.topology_file={DATA / 'testbed-topology.conf'}"])
    assert job_findings(job, facts) == []
    assert cluster_findings(facts) == []


def _keys(job_overrides: tuple[str, ...], kind: str = "gpu-preempt") -> dict[str, str]:
    facts = probe_cluster(FakeSlurm(cluster=recorded(kind)), "root")
    job = load_job(TESTBED_JOB, job_overrides)
    return {f.key: f.message for f in job_findings(job, facts)}


def test_what_the_cluster_cannot_honour() -> None:
    found = _keys(
        (
            *GPU_JOB,
            "cluster.partition=gpu",
            "resources.nodes=3",
            "train.global_batch_size=12",
            "resilience.max_restarts=3",
        )
    )
    assert "over partition gpu's MaxNodes of 2" in found["resources.nodes"]
    found = _keys((*GPU_JOB, "cluster.partition=gpu", "resources.time_limit_min=300"))
    assert found["resources.time_limit_min"] == "300 min is over partition gpu's MaxTime of 240 min"
    found = _keys((*GPU_JOB, "cluster.partition=gpus"))
    assert "partition 'gpus' does not exist; did you mean 'gpu'?" in found["cluster.partition"]
    found = _keys((*GPU_JOB, "cluster.partition=batch"), kind="testbed")
    assert "has no GPU gres" in found["hardware.gpus_per_node"]
    found = _keys(("resources.cpus_per_task=3", "resources.mem_gb=5"), kind="testbed")
    assert found["resources.cpus_per_task"].endswith(
        "2 x cpus_per_task 3 = 6 CPUs per node; partition batch's largest node has 4"
    )
    assert found["resources.mem_gb"] == "5 GiB per node; partition batch's largest node has 4096 MB"
    found = _keys(("cluster.account=physics",), kind="testbed")
    assert found["cluster.account"] == "'physics' is not one of root's accounts (root)"


def test_nodes_without_enough_gpus_are_not_counted() -> None:
    """Partition `all` has 8 nodes, but only 4 with GPUs: 6 GPU nodes cannot be had."""
    found = _keys(
        (
            *GPU_JOB,
            "cluster.partition=all",
            "resources.nodes=6",
            "train.global_batch_size=24",
            "resources.time_limit_min=30",
        )
    )
    assert "only 4 of partition all's 8 have 8 GPUs" in found["resources.nodes"]


def test_preemption_findings() -> None:
    """gpu: REQUEUE with GraceTime 30 s and the user signal sent; all: REQUEUE, GraceTime 0; urgent: OFF."""
    found = _keys((*GPU_JOB, "cluster.partition=gpu", "resilience.signal_lead_s=60"))
    assert "GraceTime=30 s to save, less than the 60 s" in found["resilience.signal_lead_s"]
    assert "resilience.signal" not in found  # preempt_send_user_signal is set
    assert _keys((*GPU_JOB, "cluster.partition=urgent")) == {}
    facts = probe_cluster(FakeSlurm(cluster=recorded("gpu-preempt")), "root")
    by_partition = {f.message.split(":")[0]: f.key for f in cluster_findings(facts, "all")}
    assert by_partition == {"AccountingStorageType is none": "AccountingStorageType", "partition all": "GraceTime"}


def test_user_signal_not_sent_on_preemption() -> None:
    text = recorded("gpu-preempt")
    text.config = text.config.replace("enable_configless,preempt_send_user_signal", "enable_configless")
    facts = probe_cluster(FakeSlurm(cluster=text), "root")
    job = load_job(TESTBED_JOB, (*GPU_JOB, "cluster.partition=gpu"))
    found = {f.key: f.message for f in job_findings(job, facts)}
    assert found["resilience.signal"].startswith("preemption sends SIGTERM, not SIGUSR2")


def run_cli(args: list[str], fake: FakeSlurm) -> tuple[int, str]:
    from click.testing import CliRunner

    result = CliRunner().invoke(cli, args, obj={"slurm_client": fake}, catch_exceptions=False)
    return result.exit_code, result.output


def test_doctor_cli_json_and_exit_codes() -> None:
    code, out = run_cli(["doctor", "--json"], FakeSlurm(cluster=recorded("gpu-preempt")))
    assert code == 0
    data = json.loads(out)
    assert data["cluster"]["slurm"]["version"] == "22.05.8" and data["ok"]
    assert [p["name"] for p in data["cluster"]["partitions"]] == ["all", "gpu", "urgent"]
    code, out = run_cli(
        [
            "doctor",
            str(TESTBED_JOB),
            *[a for o in GPU_JOB for a in ("--set", o)],
            "--set",
            "cluster.partition=gpu",
            "--set",
            "resources.time_limit_min=300",
        ],
        FakeSlurm(cluster=recorded("gpu-preempt")),
    )
    assert code == 1
    assert "error    resources.time_limit_min: 300 min is over partition gpu's MaxTime of 240 min" in out
    assert "preemption   preempt/partition_prio, PreemptMode=REQUEUE, preempt_send_user_signal set" in out


def test_doctor_only_reads() -> None:
    fake = FakeSlurm(cluster=recorded("testbed"))
    run_cli(["doctor", str(TESTBED_JOB)], fake)
    assert {call[0] for call in fake.calls} == {"scontrol", "sinfo", "sacct", "sacctmgr"}
    for call in fake.calls:
        words = [w for w in call[1:] if not w.startswith("-")]
        if call[0] in ("scontrol", "sacctmgr"):
            assert words[0] == "show", call
        else:
            assert words == [], call  # sinfo and sacct: options only, a query


def test_cluster_init_writes_a_profile_the_loader_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    fake = FakeSlurm(cluster=recorded("gpu-preempt"))
    code, out = run_cli(["cluster", "init", "hpc1", "--partition", "gpu"], fake)
    assert code == 0, out
    profile = tmp_path / "configs" / "clusters" / "hpc1.yaml"
    text = profile.read_text()
    assert "preempt_send_user_signal" not in text.split("sends")[0]
    assert "signal: preemption (preempt/partition_prio, REQUEUE) sends the job's --signal" in text
    jobs = tmp_path / "configs" / "jobs"
    jobs.mkdir()
    job_file = jobs / "job.yaml"
    job_file.write_text(TESTBED_JOB.read_text().replace("cluster: testbed", "cluster: hpc1"))
    job = load_job(job_file)
    assert (job.cluster.name, job.cluster.partition, job.cluster.account) == ("hpc1", "gpu", None)
    assert job.cluster.slurm_version == "22.05.8", "the controller's release, for what a block job may pin"
    assert "account: none found (no accounting" in text
    assert job.cluster.topology_file is None  # the controller's topology.conf is not readable from here


def test_doctor_checks_the_presets_nccl_settings_against_this_node() -> None:
    """The H100 preset names bond0 and mlx5_* devices: doctor says what this machine has instead."""
    node = read_node_network()
    if any(i.up and i.name.startswith("bond0") for i in node.interfaces):
        pytest.skip("this machine has a bond0 interface")
    sets = [a for o in (*GPU_JOB, "cluster.partition=gpu") for a in ("--set", o)]
    code, out = run_cli(["doctor", str(TESTBED_JOB), *sets], FakeSlurm(cluster=recorded("gpu-preempt")))
    assert code == 0, out  # outside an allocation this node may not be a compute node: warnings
    assert f"node         {node.host}: interfaces " in out
    assert "warning  NCCL_SOCKET_IFNAME: '=bond0' selects no interface that is up" in out
    _, out = run_cli(["doctor", "--json", str(TESTBED_JOB), *sets], FakeSlurm(cluster=recorded("gpu-preempt")))
    data = json.loads(out)
    assert data["node"]["host"] == node.host
    assert "NCCL_SOCKET_IFNAME" in {f["key"] for f in data["findings"]}


def test_doctor_refuses_a_container_job_without_pyxis() -> None:
    sets = [
        a
        for o in (*GPU_JOB, "cluster.partition=gpu", "container.image=nvcr.io/nvidia/pytorch:25.01-py3")
        for a in ("--set", o)
    ]
    fake = FakeSlurm(cluster=recorded("gpu-preempt"))
    code, out = run_cli(["doctor", str(TESTBED_JOB), *sets], fake)
    assert code == 1
    assert "error    container.image: srun here has no --container-image: the pyxis SPANK plugin is not loaded" in out
    assert ["srun", "--help"] in fake.calls
    fake = FakeSlurm(cluster=recorded("gpu-preempt"))
    fake.pyxis = True
    _, out = run_cli(["doctor", str(TESTBED_JOB), *sets], fake)
    assert "pyxis SPANK plugin" not in out


def test_cluster_init_writes_this_nodes_nccl_settings(tmp_path: Path) -> None:
    target = tmp_path / "site.yaml"
    code, out = run_cli(["cluster", "init", "site", "-o", str(target)], FakeSlurm(cluster=recorded("testbed")))
    assert code == 0, out
    node = read_node_network()
    written = yaml.safe_load(target.read_text())
    assert written.get("nccl_env", {}) == suggested_nccl_env(node)
    assert f"nccl_env: read off {node.host}'s interfaces and RDMA ports" in target.read_text()


def test_cluster_init_refuses_to_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "mine.yaml"
    target.write_text("partition: keep\n")
    with pytest.raises(SystemExit) as info:
        main(["cluster", "init", "x", "-o", str(target)])
    assert info.value.code == 2
    assert capsys.readouterr().err == f"error: {target}: already exists; review it, or pass --force to replace it\n"
    assert target.read_text() == "partition: keep\n"
    code, _ = run_cli(["cluster", "init", "x", "-o", str(target), "--force"], FakeSlurm(cluster=recorded("testbed")))
    assert code == 0 and "partition: batch" in target.read_text()


def test_cluster_init_finds_the_topology_file_beside_slurm_conf(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "topology.conf").write_text((DATA / "testbed-topology.conf").read_text())
    out = tmp_path / "tb.yaml"
    fake = FakeSlurm(cluster=recorded("testbed", accounts=("ml", "physics"), conf_dir=tmp_path))
    code, _ = run_cli(["cluster", "init", "tb", "-o", str(out)], fake)
    assert code == 0
    assert f"topology_file: {tmp_path / 'etc' / 'topology.conf'}" in out.read_text()
    assert "account: ml\n" in out.read_text()


@pytest.mark.parametrize("name", ["../evil", "a/b", ".hidden", ""])
def test_cluster_init_rejects_a_name_that_is_not_a_file_stem(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["cluster", "init", name])
    assert info.value.code == 2
    assert "expected letters, digits" in capsys.readouterr().err


def test_exit_codes_slurm_acts_on_too() -> None:
    text = recorded("testbed")
    text.config = text.config.replace("RequeueExitHold         = (null)", "RequeueExitHold         = 1,85-86")
    facts = probe_cluster(FakeSlurm(cluster=text), "root")
    assert facts.settings.requeue_exit_hold == (1, 85, 86) and facts.settings.requeue_exit == ()
    [finding] = cluster_findings(facts)
    assert finding.key == "RequeueExitHold" and finding.message.startswith("lists exit code(s) 85, 86, which")


@pytest.mark.parametrize(
    ("topology", "severity", "message"),
    [
        ("SwitchName=s1 Nodes=n[1-10]\n", "warning", "2 of its nodes are not in partition batch (n[9-10])"),
        ("SwitchName=s1 Nodes=m[1-8]\n", "error", "only 0 of its 8 nodes are in partition batch (2 needed)"),
        ("SwitchName=s1 Nodes=n[1-2]\nSwitchName=s1 Nodes=n[3-4]\n", "error", "s1"),
    ],
)
def test_the_jobs_topology_file_against_the_partition(
    tmp_path: Path, topology: str, severity: str, message: str
) -> None:
    topo = tmp_path / "topology.conf"
    topo.write_text(topology)
    facts = probe_cluster(FakeSlurm(cluster=recorded("testbed")), "root")
    job = load_job(TESTBED_JOB, [f"cluster.topology_file={topo}"])
    [finding] = job_findings(job, facts)
    assert (finding.severity, finding.key) == (severity, "cluster.topology_file")
    assert message in finding.message


def test_a_missing_topology_file_is_an_error(tmp_path: Path) -> None:
    facts = probe_cluster(FakeSlurm(cluster=recorded("testbed")), "root")
    job = load_job(TESTBED_JOB, [f"cluster.topology_file={tmp_path / 'gone.conf'}"])
    [finding] = job_findings(job, facts)
    assert finding.severity == "error" and "cannot read: No such file or directory" in finding.message


def test_the_clusters_own_topology_file_must_be_readable_by_air_hpc(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "topology.conf").write_text("SwitchName=s1 Nodes=n[1-4] Bogus=1\n")
    facts = probe_cluster(FakeSlurm(cluster=recorded("testbed", conf_dir=tmp_path)), "root")
    assert facts.topology.file == tmp_path / "etc" / "topology.conf"
    [finding] = cluster_findings(facts)
    assert finding.key == "topology file" and "unknown key 'Bogus'" in finding.message
    (tmp_path / "etc" / "topology.conf").write_text((DATA / "testbed-topology.conf").read_text())
    assert cluster_findings(facts) == []


def test_cluster_init_into_an_unwritable_place_is_a_user_error(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from air_hpc.errors import UserError

    (tmp_path / "file").write_text("")
    target = tmp_path / "file" / "x.yaml"
    fake = FakeSlurm(cluster=recorded("testbed"))
    result = CliRunner().invoke(cli, ["cluster", "init", "x", "-o", str(target)], obj={"slurm_client": fake})
    assert isinstance(result.exception, UserError) and result.exception.exit_code == 2
    assert str(result.exception).startswith(f"{target}: cannot write: ")


def test_dry_run_of_a_gpu_job_on_a_cpu_partition_says_what_doctor_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], small_corpus: Path
) -> None:
    """Slurm's "Invalid generic resource (gres) specification" becomes doctor's finding, exit 2 (issue 24 item 6)."""
    fake = FakeSlurm(cluster=recorded("testbed"))
    sets = [f"run.root={tmp_path}", f"data.path={small_corpus}", "placement.topology_aware=false", *GPU_JOB]
    args = ["submit", str(TESTBED_JOB), *(a for s in sets for a in ("--set", s)), "--dry-run"]
    with pytest.raises(ConfigError) as refused:
        cli.main(args=args, standalone_mode=False, obj={"slurm_client": fake})
    assert refused.value.exit_code == 2
    lines = str(refused.value).splitlines()
    doctor_words = "hardware h100-sxm uses 8 GPUs per node but partition batch has no GPU gres"
    assert f"hardware.gpus_per_node: {doctor_words} (sinfo %G shows none); pick a GPU partition" in lines
    assert lines[0].startswith("resources.cpus_per_task: tasks_per_node 8 x cpus_per_task 2 = 16 CPUs per node")
    assert lines[-1] == (
        "sbatch --test-only refused the job: Batch job submission failed: Invalid generic resource (gres) specification"
    )
    doctor = cli.main(args=["doctor", *args[1:-1]], standalone_mode=False, obj={"slurm_client": fake})
    assert doctor == 1 and doctor_words in capsys.readouterr().out
