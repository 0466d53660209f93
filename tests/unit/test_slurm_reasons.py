"""Slurm's pending reasons in plain words, and sbatch's refusals of what a job asks."""

from pathlib import Path

import pytest

from air_hpc.slurm.jobs import JobState, JobStatus
from air_hpc.slurm.reasons import is_limit, plain_reason, refusal, with_reason

#: Every reason string of Slurm 26.05 (src/common/job_state_reason.c), which contains 22.05's.
EVERY_REASON = (Path(__file__).parent.parent / "data" / "slurm" / "job_state_reasons.txt").read_text().split()


@pytest.mark.parametrize(
    ("reason", "words"),
    [
        ("AssocGrpNodeLimit", "held by its account's node quota: the account's running jobs hold all of it"),
        ("QOSGrpNodeLimit", "held by its QOS's node quota: the QOS's running jobs hold all of it"),
        ("QOSMaxNodePerUserLimit", "held by its QOS's node limit per user: its user's running jobs hold all of it"),
        ("AssocMaxNodePerJobLimit", "will not start: asks for more nodes than its account's limit for a job"),
        ("QOSMaxWallDurationPerJobLimit", "will not start: asks for more time than its QOS's limit for a job"),
        (
            "AssocGrpGRESMinutes",
            "held by its account's GPU/GRES-minutes quota: the account's running jobs hold all of it",
        ),
        (
            "QOSGrpCPURunMinutesLimit",
            "held by its QOS's CPU running-minutes quota: the QOS's running jobs hold all of it",
        ),
        ("AssocGrpJobsLimit", "held by its account's limit on running jobs at once"),
        ("QOSMaxSubmitJobPerUserLimit", "held by its QOS's limit on queued jobs per user"),
        ("MaxNodePerAccount", "held by its QOS's node limit per account: its account's running jobs hold all of it"),
        ("QOSMinCpuNotSatisfied", "will never start: asks for less than its QOS's minimum of CPUs"),
        ("Priority", "waiting for jobs of higher priority to start first"),
        ("Resources", "waiting for free nodes"),
        ("ReqNodeNotAvail, UnavailableNodes:n3", "a node it requires is unavailable (down, drained or reserved)"),
        ("launch failed requeued held", "held after its launch failed (scontrol release once the node is fixed)"),
        ("None", ""),
        ("", ""),
        ("SomethingNewInSlurm99", "SomethingNewInSlurm99"),
    ],
)
def test_reasons_read_as_plain_words(reason: str, words: str) -> None:
    assert plain_reason(reason) == words


def test_every_reason_slurm_has_gets_words_of_its_own() -> None:
    assert len(EVERY_REASON) > 200
    unmapped = [r for r in EVERY_REASON if r != "None" and plain_reason(r) in ("", r)]
    assert unmapped == []


def test_limits_are_told_from_waits_for_nodes() -> None:
    assert all(is_limit(r) for r in ("AssocGrpNodeLimit", "QOSMaxNodePerUserLimit", "MaxJobsPerAccount"))
    assert all(is_limit(r) for r in ("AssociationResourceLimit", "AccountingPolicy"))
    assert not any(is_limit(r) for r in ("Priority", "Resources", "Dependency", "BeginTime", "", "None"))


def test_a_state_shows_the_reason_with_its_words_once() -> None:
    assert with_reason("PENDING", "AssocGrpNodeLimit") == (
        "PENDING (AssocGrpNodeLimit: held by its account's node quota: the account's running jobs hold all of it)"
    )
    assert with_reason("PENDING", "") == "PENDING"
    assert with_reason("COMPLETED", "every step trained") == "COMPLETED (every step trained)"


def test_a_job_status_carries_the_reason_text_in_json() -> None:
    status = JobStatus("7", JobState.PENDING, 2, "", "run", 0, "squeue", "QOSGrpNodeLimit")
    assert status.to_json()["reason_text"] == plain_reason("QOSGrpNodeLimit")


@pytest.mark.parametrize(
    ("stderr", "key"),
    [
        (
            "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified",
            "cluster.account",
        ),
        ("sbatch: error: Batch job submission failed: Invalid qos specification", "cluster.qos"),
        ("sbatch: error: allocation failure: Invalid qos specification", "cluster.qos"),
        ("sbatch: error: Batch job submission failed: Invalid partition name specified", "cluster.partition"),
    ],
)
def test_sbatch_refusals_name_the_key_to_fix(stderr: str, key: str) -> None:
    said = refusal(stderr)
    assert said is not None and said.startswith("Slurm refused the job: ") and f"check {key}" in said
    assert "sbatch: error" not in said


def test_other_sbatch_errors_are_not_refusals() -> None:
    assert refusal("sbatch: error: Batch job submission failed: Socket timed out on send/recv operation") is None
