"""Every parser of Slurm's output, on what each release really printed for the testbed (22.05 through 26.05).

The fixtures are recorded by ``scripts/slurm-capture.sh`` from a testbed with the default leaves (2,4,2: nodes
n1-n8 on three leaf switches, 4 CPUs and 4096 MB each, partitions ``batch`` and ``urgent``), in which it submits
a 2-node sleeper named ``sleepy | name``, a held job, a 1-node job exiting 3, and a 1-node job it requeues.
"""

from pathlib import Path

import pytest

from air_hpc.errors import SlurmError
from air_hpc.slurm.cluster import parse_partitions, parse_show_config, parse_sinfo_groups, parse_topology
from air_hpc.slurm.hostlist import expand
from air_hpc.slurm.jobs import (
    JobState,
    parse_sacct,
    parse_scontrol_job,
    parse_squeue,
    parse_tagged,
    parse_test_only,
)
from air_hpc.slurm.nodes import parse_scontrol_nodes, parse_sinfo
from air_hpc.slurm.version import parse_version

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
RELEASES = sorted(p.parent for p in DATA.glob("*/scontrol-version.out"))
NODES = frozenset(f"n{i}" for i in range(1, 9))

pytestmark = pytest.mark.parametrize("release", RELEASES, ids=lambda p: p.name)


def _read(release: Path, name: str) -> str:
    return (release / name).read_text()


def test_version_of_every_command_is_the_directory_release(release: Path) -> None:
    for name in ("scontrol-version.out", "sbatch-version.out"):
        assert str(parse_version(_read(release, name))) == release.name
    assert parse_show_config(_read(release, "scontrol-show-config.out")).version == release.name


def test_test_only_reply_and_refusal(release: Path) -> None:
    result = parse_test_only(_read(release, "sbatch-test-only.out"))
    assert result.partition == "batch" and result.nodelist.startswith("n[") and result.start[:2] == "20"
    with pytest.raises(SlurmError, match="unexpected output"):
        parse_test_only(_read(release, "sbatch-test-only-refused.out"))


def test_squeue_keeps_names_states_and_reasons(release: Path) -> None:
    records = {r.name: r for r in parse_squeue(_read(release, "squeue.out"))}
    running, held = records["sleepy | name"], records["held"]
    assert (running.state, running.nodes, running.reason) == (JobState.RUNNING, 2, "")  # Slurm's "None"
    assert running.nodelist.startswith("n") and running.time_limit == "5:00"
    assert (held.state, held.nodelist, held.reason) == (JobState.PENDING, "", "JobHeldUser")
    tagged = parse_tagged(_read(release, "squeue-tagged.out"))
    assert {job_id for job_id, _, _ in tagged} == {r.job_id for r in records.values()}
    assert all(workdir.startswith("/") and comment == "" for _, workdir, comment in tagged)


def test_scontrol_show_job(release: Path) -> None:
    running = parse_scontrol_job(_read(release, "scontrol-show-job-running.out"))
    held = parse_scontrol_job(_read(release, "scontrol-show-job-held.out"))
    requeued = parse_scontrol_job(_read(release, "scontrol-show-job-requeued.out"))
    assert (running["JobState"], running["NumNodes"], running["Restarts"]) == ("RUNNING", "2", "0")
    assert running["BatchHost"] in NODES and running["ExitCode"] == "0:0"
    assert (held["JobState"], held["Reason"]) == ("PENDING", "JobHeldUser")
    assert requeued["Restarts"] == "1" and requeued["JobState"] in {"PENDING", "REQUEUED", "RUNNING"}


def test_sacct_records_every_run(release: Path) -> None:
    records = parse_sacct(_read(release, "sacct.out"))
    by_name: dict[str, list[JobState]] = {}
    for record in records:
        by_name.setdefault(record.name, []).append(record.state)
    assert by_name["sleepy | name"] == [JobState.CANCELLED] and by_name["held"] == [JobState.CANCELLED]
    assert by_name["quick"] == [JobState.FAILED]
    assert [r.exit_code for r in records if r.name == "quick"] == [3]
    assert by_name["requeued"][0] is JobState.REQUEUED and len(by_name["requeued"]) == 2


def test_node_states_and_groups(release: Path) -> None:
    shown = parse_scontrol_nodes(_read(release, "scontrol-show-nodes.out"))
    listed = parse_sinfo(_read(release, "sinfo-node-states.out"))
    assert shown.all_nodes == listed.all_nodes == NODES
    (sleeper,) = [r for r in parse_squeue(_read(release, "squeue.out")) if r.state is JobState.RUNNING]
    busy = expand(sleeper.nodelist, "squeue")  # mixed: 2 of their 4 CPUs are the sleeper's
    assert set(shown.unavailable) == set(listed.unavailable) == set(busy) and len(busy) == 2
    groups = parse_sinfo_groups(_read(release, "sinfo-groups.out"))
    assert set(groups) == {"batch", "urgent"}
    assert [(g.nodes, g.cpus, g.mem_mb, g.gpus) for g in groups["batch"]] == [(8, 4, 4096, 0)]


def test_partitions_config_and_topology(release: Path) -> None:
    batch, urgent = parse_partitions(_read(release, "scontrol-show-partition.out"))
    assert (batch.name, batch.default, batch.total_nodes, batch.preempt_mode) == ("batch", True, 8, "REQUEUE")
    assert (urgent.name, urgent.default, urgent.preempt_mode) == ("urgent", False, "OFF")
    settings = parse_show_config(_read(release, "scontrol-show-config.out"))
    assert (settings.cluster_name, settings.select_type, settings.topology_plugin) == (
        "airtb",
        "select/cons_tres",
        "topology/tree",
    )
    assert settings.preempt_type == "preempt/partition_prio" and settings.job_requeue
    assert settings.accounting_storage == "accounting_storage/slurmdbd" and settings.kill_wait_s == 5
    assert parse_topology(_read(release, "scontrol-show-topology.out")) == (3, 4)
