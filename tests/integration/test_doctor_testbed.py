"""``air-hpc doctor`` and ``cluster init`` against real controllers: the testbed, and a GPU cluster with preemption.

The second is a throw-away slurmctld of CLOUD nodes whose slurm.conf declares
GPU gres, partition-priority preemption with ``preempt_send_user_signal`` and
partition limits, so doctor reads what a real 22.05 controller prints for them.
"""

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from air_hpc.cli.main import cli
from air_hpc.config import load_job
from air_hpc.slurm.client import SlurmClient
from air_hpc.testbed.cloud import CloudController
from tests.integration.matrix import matrix_build

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TESTBED_JOB = REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml"
GPU_CONF = (
    "PreemptType=preempt/partition_prio",
    "PreemptMode=REQUEUE",
    "SlurmctldParameters=preempt_send_user_signal",
    "GresTypes=gpu",
    "NodeName=g[1-4] CPUs=16 RealMemory=64000 Gres=gpu:h100:8 State=CLOUD",
    "PartitionName=gpu Nodes=g[1-4] MaxTime=04:00:00 MaxNodes=2 GraceTime=30 PriorityTier=1 State=UP",
    "PartitionName=urgent Nodes=g[1-4] MaxTime=1-00:00:00 PriorityTier=10 PreemptMode=OFF State=UP",
)
#: 8 ranks per node, two cores each (the GPU nodes here have 16, not the preset's 112).
GPU_JOB = (
    "hardware=h100-sxm",
    "resources.tasks_per_node=8",
    "resources.cpus_per_task=2",
    "train.global_batch_size=8",
    "train.micro_batch_size=1",
)


def invoke(args: list[str], client: SlurmClient) -> tuple[int, str]:
    result = CliRunner().invoke(cli, args, obj={"slurm_client": client}, catch_exceptions=False)
    return result.exit_code, result.output


def sets(*overrides: str) -> list[str]:
    return [word for item in overrides for word in ("--set", item)]


def test_doctor_on_the_testbed(testbed: Any) -> None:
    code, out = invoke(["doctor", "--json"], testbed.client)
    assert code == 0, out
    data = json.loads(out)["cluster"]
    assert data["slurm"]["version"].startswith("22.05") and data["slurm"]["topology_plugin"] == "topology/tree"
    assert data["accounting"]["available"] and data["topology"]["file"] == str(testbed.topology_conf)
    assert data["topology"]["leaves"] == 3
    batch, urgent = data["partitions"]
    assert (batch["name"], batch["total_nodes"], batch["max_gpus_per_node"]) == ("batch", 8, 0)
    assert (urgent["name"], urgent["total_nodes"]) == ("urgent", 8)

    code, out = invoke(
        ["doctor", str(TESTBED_JOB), *sets(f"cluster.topology_file={testbed.topology_conf}")], testbed.client
    )
    assert code == 0 and "nothing this cluster cannot honour" in out

    code, out = invoke(
        ["doctor", str(TESTBED_JOB), *sets(*GPU_JOB, "resources.nodes=9", "train.global_batch_size=36")], testbed.client
    )
    assert code == 1
    assert "error    resources.nodes: 9 nodes but partition batch has 8" in out
    assert (
        "error    hardware.gpus_per_node: hardware h100-sxm uses 8 GPUs per node but partition batch has no GPU" in out
    )


def test_cluster_init_on_the_testbed_drafts_a_profile_a_job_can_use(testbed: Any, tmp_path: Path) -> None:
    profile = tmp_path / "configs" / "clusters" / "mine.yaml"
    code, out = invoke(["cluster", "init", "mine", "-o", str(profile)], testbed.client)
    assert code == 0, out
    job_file = tmp_path / "configs" / "jobs" / "job.yaml"
    job_file.parent.mkdir()
    job_file.write_text(TESTBED_JOB.read_text().replace("cluster: testbed", "cluster: mine"))
    job = load_job(job_file)
    assert (job.cluster.partition, job.cluster.account, job.cluster.topology_file) == (
        "batch",
        "root",
        testbed.topology_conf,
    )
    code, out = invoke(["doctor", str(job_file)], testbed.client)
    assert code == 0 and "nothing this cluster cannot honour" in out


def test_doctor_reads_preemption_and_gres_from_a_real_controller(tmp_path: Path) -> None:
    topology = "SwitchName=s1 Nodes=c[1-4]\nSwitchName=s2 Nodes=g[1-4]\nSwitchName=top Switches=s[1-2]\n"
    nodes = [f"c{i}" for i in range(1, 5)]
    with CloudController(topology, nodes, tmp_path, extra_conf=GPU_CONF, build=matrix_build()) as ctl:
        code, out = invoke(["doctor", "--json"], ctl.client)
        assert code == 0, out
        slurm = json.loads(out)["cluster"]["slurm"]
        assert slurm["preemption_enabled"] and slurm["preempt_send_user_signal"]
        assert slurm["gres_types"] == ["gpu"]

        job = [str(TESTBED_JOB), *sets(*GPU_JOB, "cluster.partition=gpu", "resources.time_limit_min=300")]
        code, out = invoke(["doctor", *job], ctl.client)
        assert code == 1
        assert "resources.time_limit_min: 300 min is over partition gpu's MaxTime of 240 min" in out
        assert "GraceTime=30 s to save, less than the 60 s this job allows" in out
        assert "warning  AccountingStorageType" in out

        code, out = invoke(["doctor", str(TESTBED_JOB), *sets(*GPU_JOB, "cluster.partition=urgent")], ctl.client)
        assert code == 0, out

        code, out = invoke(
            ["cluster", "init", "gpu", "-o", str(tmp_path / "gpu.yaml"), "--partition", "gpu"], ctl.client
        )
        assert code == 0, out
        text = (tmp_path / "gpu.yaml").read_text()
        assert "partition: gpu\n" in text and f"topology_file: {tmp_path / 'topology.conf'}\n" in text
        assert "sends the job's --signal (resilience.signal) and SIGTERM, then waits GraceTime=30 s" in text
