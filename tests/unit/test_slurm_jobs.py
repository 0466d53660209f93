"""Parsers of squeue / sacct / scontrol / sbatch text, on output recorded from Slurm 22.05 (the testbed)."""

import pytest

from air_hpc.errors import SlurmError
from air_hpc.slurm.jobs import (
    JobRecord,
    JobState,
    accounting_ids,
    holds_element,
    merge_status,
    parse_exit_code,
    parse_sacct,
    parse_sbatch_parsable,
    parse_scontrol_job,
    parse_squeue,
    parse_state,
    parse_test_only,
)

# Recorded with the formats the client asks for (SQUEUE_FORMAT, SACCT_FIELDS).
SQUEUE_RUNNING = "5|RUNNING|2|n[1-2]|None|0:02|365-00:00:00|sleepy | name\n"
SQUEUE_HELD = '1|PENDING|1||JobHeldUser|0:00|UNLIMITED|x"; touch pwned; echo " a#b $(x) `y` back\\slash\n'
SACCT_REQUEUED = "3|REQUEUED|0:0|2|n[1-2]|00:00:01|00:30:00|r2\n3|COMPLETED|0:0|2|n[1-2]|00:00:00|00:30:00|r2\n"
SACCT_CANCELLED = "5|CANCELLED by 0|0:0|2|n[1-2]|00:00:02|365-00:00:00|sleepy | name\n"
SACCT_NEVER_RAN = "1|CANCELLED by 0|0:0|0|None assigned|00:00:00||allocation\n"
SCONTROL_JOB = (
    "JobId=5 JobName=sleepy | name UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901756 Nice=0 "
    "Account=root QOS=normal JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 "
    "Reboot=0 ExitCode=0:0 RunTime=00:00:02 TimeLimit=365-00:00:00 TimeMin=N/A Partition=debug "
    "ReqNodeList=(null) ExcNodeList=(null) NodeList=n[1-2] BatchHost=n1 NumNodes=2 NumCPUs=2 NumTasks=2 "
    "Command=(null) WorkDir=/work/main StdErr=/work/main/slurm-5.out StdIn=/dev/null StdOut=/work/main/slurm-5.out\n"
)
TEST_ONLY = "sbatch: Job 4 to start at 2026-12-02T13:28:19 using 4 processors on nodes n[3-4] in partition debug\n"
#: 25.05 and 26.05 print a stray "a" (src/api/allocate.c), and the cluster when the reply names one.
TEST_ONLY_25 = (
    "sbatch: Job 17 to start at 2026-12-02T13:28:19 a using 2592 processors on nodes gb[199-216] in partition topo\n"
)
TEST_ONLY_CLUSTER = (
    "sbatch: Job 3 to start at 2026-12-02T13:28:19 on cluster air a using 4 processors on nodes n[3-4] "
    "in partition debug\n"
    "  Preempts: 2,5\n"
)
TEST_ONLY_HETEROGENEOUS = "sbatch: Job 8 to start at 2026-12-02T13:28:19 using 8 processors on n[1-4]\n"


def test_squeue_running_keeps_separator_in_name() -> None:
    (rec,) = parse_squeue(SQUEUE_RUNNING)
    assert rec == JobRecord(
        job_id="5",
        state=JobState.RUNNING,
        nodes=2,
        nodelist="n[1-2]",
        name="sleepy | name",
        reason="",
        elapsed="0:02",
        time_limit="365-00:00:00",
    )


def test_squeue_pending_with_hostile_name() -> None:
    (rec,) = parse_squeue(SQUEUE_HELD)
    assert rec.state is JobState.PENDING and rec.reason == "JobHeldUser" and rec.nodelist == ""
    assert rec.name == 'x"; touch pwned; echo " a#b $(x) `y` back\\slash'


def test_squeue_empty_and_malformed() -> None:
    assert parse_squeue("\n") == []
    with pytest.raises(SlurmError, match="squeue: expected 8"):
        parse_squeue("5|RUNNING\n")


def test_sacct_duplicates_list_requeued_runs_first() -> None:
    records = parse_sacct(SACCT_REQUEUED)
    assert [r.state for r in records] == [JobState.REQUEUED, JobState.COMPLETED]
    assert records[-1].exit_code == 0 and records[-1].exit_signal == 0


def test_sacct_cancelled_and_never_ran() -> None:
    (rec,) = parse_sacct(SACCT_CANCELLED)
    assert rec.state is JobState.CANCELLED and rec.name == "sleepy | name"
    (never,) = parse_sacct(SACCT_NEVER_RAN)
    assert never.nodelist == "" and never.nodes == 0


@pytest.mark.parametrize(
    ("text", "state"),
    [
        ("CANCELLED by 0", JobState.CANCELLED),
        ("COMPLETED", JobState.COMPLETED),
        ("RUNNING", JobState.RUNNING),
        ("PD", JobState.PENDING),
        ("OUT_OF_MEMORY", JobState.OUT_OF_MEMORY),
        ("REQUEUED", JobState.REQUEUED),
        ("NEW_STATE_FROM_2030", JobState.UNKNOWN),
    ],
)
def test_parse_state(text: str, state: JobState) -> None:
    assert parse_state(text) is state


def test_terminal_states() -> None:
    assert JobState.COMPLETED.terminal and JobState.FAILED.terminal and JobState.TIMEOUT.terminal
    assert not JobState.PENDING.terminal and not JobState.REQUEUED.terminal and not JobState.RUNNING.terminal


@pytest.mark.parametrize(("text", "code"), [("0:0", (0, 0)), ("85:0", (85, 0)), ("0:9", (0, 9)), ("", (None, None))])
def test_exit_code(text: str, code: tuple[int | None, int | None]) -> None:
    assert parse_exit_code(text) == code


def test_scontrol_job_fields() -> None:
    fields = parse_scontrol_job(SCONTROL_JOB)
    assert fields["JobState"] == "RUNNING"
    assert fields["Restarts"] == "0"
    assert fields["NodeList"] == "n[1-2]"
    assert fields["BatchHost"] == "n1"
    assert "ReqNodeList" not in fields.values()


@pytest.mark.parametrize(("text", "job_id"), [("123\n", "123"), ("77;cluster-a\n", "77")])
def test_sbatch_parsable(text: str, job_id: str) -> None:
    assert parse_sbatch_parsable(text) == job_id


@pytest.mark.parametrize("text", ["", "Submitted batch job 12\n", "sbatch: error: Batch job submission failed\n"])
def test_sbatch_parsable_rejects_other_output(text: str) -> None:
    with pytest.raises(SlurmError, match="expected a job id"):
        parse_sbatch_parsable(text)


@pytest.mark.parametrize(
    ("text", "nodes", "partition"),
    [
        (TEST_ONLY, "n[3-4]", "debug"),  # 22.05 through 24.11
        (TEST_ONLY_25, "gb[199-216]", "topo"),
        (TEST_ONLY_CLUSTER, "n[3-4]", "debug"),
        (TEST_ONLY_HETEROGENEOUS, "n[1-4]", ""),
    ],
)
def test_test_only_of_every_release(text: str, nodes: str, partition: str) -> None:
    result = parse_test_only(text)
    assert (result.start, result.nodelist, result.partition) == ("2026-12-02T13:28:19", nodes, partition)


def test_test_only_refusal_is_an_error() -> None:
    with pytest.raises(SlurmError, match="unexpected output"):
        parse_test_only("sbatch: error: Requested node configuration is not available\n")


def test_merge_prefers_controller_and_counts_requeues_from_accounting() -> None:
    queued = parse_squeue(SQUEUE_RUNNING)
    live = merge_status("5", queued, [], restarts=2)
    assert live is not None and live.source == "squeue" and live.restarts == 2
    done = merge_status("3", [], parse_sacct(SACCT_REQUEUED))
    assert done is not None and done.source == "sacct" and done.state is JobState.COMPLETED and done.restarts == 1
    assert merge_status("9", [], []) is None


# `sacct --jobs=5001_2,5001` after `scancel 5001` of `--array=0-2%1` while element 0 ran: elements 1 and 2
# never started and have no record of their own (`--jobs=5001_2` alone prints nothing).
SACCT_ARRAY_CANCELLED = (
    "5001_0|CANCELLED by 0|0:0|1|n1|00:00:04|365-00:00:00|wrap\n"
    "5001_[1-2%1]|CANCELLED by 0|0:0|1|None assigned|00:00:00|UNLIMITED|wrap\n"
)


def test_an_array_element_that_never_started_takes_its_arrays_record() -> None:
    accounted = parse_sacct(SACCT_ARRAY_CANCELLED)
    for element, nodelist in (("5001_0", "n1"), ("5001_1", ""), ("5001_2", "")):
        status = merge_status(element, [], accounted)
        assert status is not None and status.state is JobState.CANCELLED and status.nodelist == nodelist
    assert merge_status("5001_3", [], accounted) is None
    assert merge_status("5002_1", [], accounted) is None
    assert merge_status("5001", [], accounted) is None


@pytest.mark.parametrize(
    ("record", "element", "held"),
    [
        ("7_[1-2%1]", "7_2", True),
        ("7_[1,4-6]", "7_5", True),
        ("7_[1,4-6]", "7_3", False),
        ("7_[1-2]", "77_1", False),
        ("7_1", "7_1", False),
        ("7_[]", "7_1", False),
    ],
)
def test_holds_element(record: str, element: str, held: bool) -> None:
    assert holds_element(record, element) is held


def test_accounting_ids_ask_for_an_elements_array_once() -> None:
    assert accounting_ids(["5", "9_1", "9_2", "10"]) == ["5", "9_1", "9_2", "10", "9"]
