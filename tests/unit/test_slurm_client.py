"""The client's typed calls and retry rule, against the fake controller (real formats, kept state)."""

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from air_hpc.errors import SlurmError, SlurmNotConfiguredError, SlurmUnreachableError
from air_hpc.slurm.client import IN_JOB, NO_CONFIG_MARKER, ONCE, PATIENT, RetryPolicy, SlurmClient, talks_to_slurmctld
from air_hpc.slurm.fake import FakeClusterText, FakeJob, FakeSlurm
from air_hpc.slurm.jobs import JobState
from air_hpc.slurm.version import SlurmVersion

SCRIPT = """#!/bin/bash
#SBATCH --job-name="two words"
#SBATCH --partition=debug
#SBATCH --nodes=2
srun true
#SBATCH --nodes=9
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "job.sbatch"
    path.write_text(SCRIPT)
    return path


def test_submit_then_follow_a_job_through_requeue(script: Path) -> None:
    fake = FakeSlurm()
    job_id = fake.sbatch(script)
    job = fake.jobs[job_id]
    assert (job.name, job.nodes) == ("two words", 2), "directives after the first command are ignored"
    status = fake.job_status(job_id)
    assert status is not None and status.state is JobState.PENDING and status.source == "squeue"
    fake.start(job_id, "n[1-2]")
    fake.scontrol_requeue(job_id)
    fake.start(job_id, "n[3-4]")
    status = fake.job_status(job_id)
    assert status is not None and (status.state, status.restarts, status.nodelist) == (
        JobState.RUNNING,
        1,
        "n[3-4]",
    )
    fake.finish(job_id)
    status = fake.job_status(job_id)
    assert status is not None and (status.state, status.restarts, status.source) == (JobState.COMPLETED, 1, "sacct")


def test_test_only_reports_where_it_would_run(script: Path) -> None:
    fake = FakeSlurm()
    result = fake.sbatch_test_only(script)
    assert result.nodelist == "n[1-2]" and result.partition == "debug"
    assert fake.jobs == {}


def test_unknown_job_is_none_not_an_error() -> None:
    fake = FakeSlurm()
    assert fake.job_status("999") is None
    assert fake.show_job("999") is None
    assert fake.squeue(["999"]) == []


def test_read_only_calls_retry_then_give_one_clear_error() -> None:
    fake = FakeSlurm(retries=2)
    fake.reachable = False
    with pytest.raises(SlurmUnreachableError, match=r"squeue gave no answer within 20 s") as info:
        fake.job_status("1")
    assert "\n" not in str(info.value)
    assert len(fake.calls) == 3


def test_sbatch_is_never_retried(script: Path) -> None:
    fake = FakeSlurm(retries=5)
    fake.reachable = False
    with pytest.raises(SlurmUnreachableError, match="may or may not have been submitted"):
        fake.sbatch(script)
    assert [c[0] for c in fake.calls] == ["sbatch"]


def test_requeue_is_never_retried() -> None:
    fake = FakeSlurm(retries=5)
    fake.reachable = False
    with pytest.raises(SlurmUnreachableError):
        fake.scontrol_requeue("1")
    assert len(fake.calls) == 1


def test_scancel_and_signal(script: Path) -> None:
    fake = FakeSlurm()
    job_id = fake.sbatch(script)
    fake.start(job_id, "n[1-2]")
    fake.scancel(job_id, signal="USR2", batch=True)
    assert fake.jobs[job_id].signals == ["USR2"] and fake.jobs[job_id].state is JobState.RUNNING
    assert ["scancel", "--signal=USR2", "--batch", job_id] in fake.calls
    fake.scancel(job_id)
    assert fake.jobs[job_id].state is JobState.CANCELLED
    with pytest.raises(SlurmError, match="Invalid job id"):
        fake.scancel("424242")


def test_squeue_by_user_lists_only_live_jobs(script: Path) -> None:
    fake = FakeSlurm()
    first, second = fake.sbatch(script), fake.sbatch(script)
    fake.finish(first)
    assert [r.job_id for r in fake.squeue(user="root")] == [second]


def test_each_call_takes_its_own_retry_policy() -> None:
    fake = FakeSlurm(retries=3)
    fake.reachable = False
    for policy, calls in ((ONCE, 1), (RetryPolicy(retries=1), 2), (PATIENT, 4)):
        fake.calls.clear()
        fake._down_until = 0.0  # forget the outage the previous call remembered
        with pytest.raises(SlurmUnreachableError):
            fake.show_job("1", retry=policy)
        assert len(fake.calls) == calls, policy


def test_a_policys_deadline_is_capped_by_the_clients() -> None:
    fake = FakeSlurm(retries=0)
    fake.reachable = False
    with pytest.raises(SlurmUnreachableError, match=r"gave no answer within 10 s"):
        fake.show_job("1", retry=IN_JOB)
    fake.deadline_s, fake._down_until = 2.0, 0.0
    with pytest.raises(SlurmUnreachableError, match=r"gave no answer within 2 s"):
        fake.show_job("1", retry=IN_JOB)


def test_version_asks_no_daemon() -> None:
    assert not talks_to_slurmctld(["scontrol", "--version"]) and not talks_to_slurmctld(["sbatch", "--version"])
    assert talks_to_slurmctld(["scontrol", "show", "job", "1"])
    fake = FakeSlurm()
    fake.version_line = "slurm-wlm 24.11.5"
    assert fake.version() == SlurmVersion(24, 11, 5)


def test_update_job_and_requeue_are_tried_once() -> None:
    fake = FakeSlurm(retries=5)
    fake.update_job("7", {"ExcNodeList": "n1,n3", "ReqNodeList": "n2"})
    assert fake.calls[-1] == ["scontrol", "update", "jobid=7", "ExcNodeList=n1,n3", "ReqNodeList=n2"]
    fake.reachable = False
    with pytest.raises(SlurmUnreachableError):
        fake.update_job("7", {"ExcNodeList": "n1"})
    assert len(fake.calls) == 2


def test_sbatch_wrap_submits_once_with_its_options() -> None:
    fake = FakeSlurm(retries=5)
    job_id = fake.sbatch_wrap("sleep 1", ["--job-name=blocker", "--nodes=2"])
    assert (fake.jobs[job_id].name, fake.jobs[job_id].nodes) == ("blocker", 2)
    assert fake.calls[-1] == ["sbatch", "--parsable", "--job-name=blocker", "--nodes=2", "--wrap=sleep 1"]
    fake.reachable = False
    with pytest.raises(SlurmUnreachableError, match="may or may not have been submitted"):
        fake.sbatch_wrap("sleep 1")
    assert len(fake.calls) == 2


def test_partitions_are_parsed_from_scontrol() -> None:
    text = "PartitionName=batch Default=YES GraceTime=30 MaxTime=UNLIMITED Nodes=n[1-8] TotalNodes=8\n"
    fake = FakeSlurm(cluster=FakeClusterText(config="", partitions=text, sinfo=""))
    (batch,) = fake.partitions()
    assert (batch.name, batch.default, batch.grace_time_s) == ("batch", True, 30)
    assert fake.calls == [["scontrol", "show", "partition", "--oneliner"]]


def test_preemption_reads_the_job_then_the_release() -> None:
    fake = FakeSlurm()
    fake.jobs["5"] = FakeJob("5", "run", 1, "", preempt_time="2026-12-03T07:00:00", end_time="2026-12-03T07:00:30")
    fake.jobs["6"] = FakeJob("6", "run", 1, "")

    def requeue_by(release: str) -> str:
        fake.version_line = release
        preempted = fake.preemption("5")
        assert preempted is not None and preempted.grace_s == 30
        return preempted.requeue_by

    assert requeue_by("slurm 25.05.8") == "slurm" and requeue_by("slurm-wlm 22.05.8") == "batch"
    assert requeue_by("scontrol: something else") == "batch", "an unreadable release counts as old"
    fake.calls.clear()
    assert fake.preemption("6") is None and fake.preemption("404") is None
    assert [c[-1] for c in fake.calls] == ["6", "404"], "no version asked when there is no preemption"


class Unconfigured(FakeSlurm):
    """Slurm's tools on a machine with no slurm.conf: every command dies at once with Slurm's own words."""

    def _run_once(
        self, args: Sequence[str], input_text: str | None, timeout_s: float, *, probe_slow: bool = False
    ) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(args))
        err = f"{args[0]}: error: fetch_config: DNS SRV lookup failed\n{args[0]}: fatal: {NO_CONFIG_MARKER}\n"
        return subprocess.CompletedProcess(list(args), 1, "", err)


def test_no_configuration_is_said_as_such_at_once_not_as_an_unreachable_controller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SLURM_CONF", raising=False)
    client = Unconfigured(retries=3)
    with pytest.raises(SlurmNotConfiguredError) as info:
        client.partitions()
    assert len(client.calls) == 1, "nothing to retry: no cluster is configured"
    message = str(info.value)
    assert message.startswith("no Slurm cluster configuration found: SLURM_CONF is not set")
    assert "export SLURM_CONF=" in message and 'eval "$(air-hpc testbed env)"' in message
    assert "unreachable" not in message and info.value.exit_code == 2


def test_a_slurm_conf_that_names_no_file_is_refused_before_any_command(tmp_path: Path) -> None:
    """The real client, not the fake: Slurm's own tools would retry reading the missing file for a minute."""
    client = SlurmClient(env={"SLURM_CONF": str(tmp_path / "slurm.conf"), "PATH": str(tmp_path)})
    with pytest.raises(SlurmNotConfiguredError, match=f"SLURM_CONF={tmp_path / 'slurm.conf'} names no file"):
        client.squeue(["1"])


@pytest.mark.skipif(
    shutil.which("scontrol") is None or Path("/etc/slurm/slurm.conf").exists(),
    reason="needs Slurm's scontrol and a machine without /etc/slurm/slurm.conf",
)
def test_doctor_without_any_slurm_configuration_says_how_to_point_at_one(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    result = subprocess.run(
        [sys.executable, "-m", "air_hpc", "doctor"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert result.stderr.startswith("error: no Slurm cluster configuration found: SLURM_CONF is not set")
    assert result.stderr.count("\n") == 1 and "testbed env" in result.stderr and "gave no answer" not in result.stderr
