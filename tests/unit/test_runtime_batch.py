"""The batch script's Python half: rank order fitting, Slurm preemption, the requeue decision, bad-node exclusion."""

import datetime
import json
import subprocess
import sys
from pathlib import Path

import pytest

from air_hpc.exitcodes import REQUEUE_WORTHY, ExitCode
from air_hpc.ownership.owner import NotOwnerError, claim
from air_hpc.records.generation import write_exit_code
from air_hpc.records.jsonl import read_jsonl
from air_hpc.records.rundir import RunDir
from air_hpc.runtime.batch import (
    BatchError,
    JobStart,
    finish,
    fit_rank_order,
    main,
    requeue,
    start,
)
from air_hpc.runtime.rendezvous import master_port
from air_hpc.slurm.fake import FakeJob, FakeSlurm
from air_hpc.slurm.jobs import JobState

JOB = JobStart("4242", 1, "n[7-8]", ("n7", "n8"), 4242)


def test_a_missing_host_gives_its_ranks_to_an_unused_node_and_the_others_stay() -> None:
    order, moved = fit_rank_order(["n1", "n1", "n2", "n2", "n3", "n3"], ["n1", "n3", "n9", "n4"])
    assert order == ["n1", "n1", "n9", "n9", "n3", "n3"] and moved == {"n2": "n9"}
    assert fit_rank_order(["n2", "n1"], ["n1", "n2"]) == (["n2", "n1"], {})
    with pytest.raises(BatchError, match="n2 is not in this allocation"):
        fit_rank_order(["n1", "n2"], ["n1"])


def test_start_records_fits_and_names_rank_zero(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path)
    env = {"SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "1"}
    lines = start(run_dir, JOB, env, ["n2", "n2", "n7", "n7"], master=True)
    assert lines == [str(tmp_path / "heartbeat" / "4242-1"), "n8", str(master_port(4242, 1))]
    assert (tmp_path / "heartbeat" / "4242-1" / "hostfile").read_text() == "n8\nn8\nn7\nn7\n"
    (row,) = read_jsonl(run_dir.submissions)
    assert (row["kind"], row["job_id"], row["restart_count"], row["nodelist"]) == ("started", "4242", 1, "n[7-8]")
    assert start(run_dir, JOB, env, [], master=False) == [str(tmp_path / "heartbeat" / "4242-1")]


def test_a_job_that_does_not_own_the_run_starts_nothing_and_writes_nothing(tmp_path: Path) -> None:
    """A second sbatch of the run's own script: turned away before it writes a file (issue 27 item 1)."""
    run_dir = RunDir(tmp_path / "run")
    with claim(run_dir, lambda owner: False) as record:
        record("4241", "slurm")
    before = sorted(p.name for p in run_dir.path.rglob("*"))
    env = {"SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "1"}
    with pytest.raises(NotOwnerError, match="belongs to job 4241, not to this job 4242"):
        start(run_dir, JOB, env, ["n7", "n7", "n8", "n8"], master=True)
    assert sorted(p.name for p in run_dir.path.rglob("*")) == before
    assert main(["start", str(run_dir.path), "--rank-hosts", "n7", "n8"], {**env, "SLURM_JOB_NODELIST": "n[7-8]"}) == 1
    assert sorted(p.name for p in run_dir.path.rglob("*")) == before


@pytest.mark.parametrize(
    ("release", "requeue_by", "requeue"), [("slurm-wlm 22.05.8", "batch", True), ("slurm 25.05.8", "slurm", False)]
)
def test_a_job_slurm_preempted_is_requeued_once_by_whoever_the_release_says(
    tmp_path: Path, release: str, requeue_by: str, requeue: bool
) -> None:
    """Slurm 24.05 and later requeue a preempted job themselves; before that, the batch script does."""
    slurm = FakeSlurm()
    preempted_at = datetime.datetime.now().replace(microsecond=0) - datetime.timedelta(seconds=5)
    slurm.jobs["4242"] = FakeJob("4242", "run", 1, "", state=JobState.RUNNING, preempt_time=preempted_at.isoformat())
    slurm.jobs["4242"].end_time = (preempted_at + datetime.timedelta(seconds=30)).isoformat()
    slurm.version_line = release
    run_dir = RunDir(tmp_path)
    rc, requeued = finish(run_dir, tmp_path / "heartbeat" / "4242-0", JOB, 143, 3, slurm)
    assert (rc, requeued) == (143, requeue)
    (event,) = [e for e in read_jsonl(run_dir.events) if e["kind"] == "preempted"]
    assert (event["grace_s"], event["fit"], event["requeue_by"]) == (30, True, requeue_by)
    assert slurm.calls[-2:] == [["scontrol", "--oneliner", "show", "job", "4242"], ["scontrol", "--version"]]


@pytest.mark.parametrize("state", [JobState.COMPLETING, JobState.CANCELLED, JobState.TIMEOUT])
def test_a_job_slurm_is_ending_is_not_requeued_after_its_ranks_saved(tmp_path: Path, state: JobState) -> None:
    """scancel or the time limit sends the batch shell SIGTERM, a stop: the ranks save and exit 85, and the job
    must end as Slurm says, not come back (a requeue of a CANCELLED job succeeds)."""
    slurm = FakeSlurm()
    slurm.jobs["4242"] = FakeJob("4242", "run", 1, "", state=state)
    run_dir = RunDir(tmp_path)
    assert finish(run_dir, tmp_path / "heartbeat" / "4242-0", JOB, ExitCode.REQUEUE, 3, slurm) == (
        ExitCode.REQUEUE,
        False,
    )
    assert not run_dir.events.exists()
    slurm.jobs["4242"].state = JobState.RUNNING  # a TERM to the batch shell alone: a stop like any other
    assert finish(run_dir, tmp_path / "heartbeat" / "4242-0", JOB, ExitCode.REQUEUE, 3, slurm) == (
        ExitCode.REQUEUE,
        True,
    )


def test_an_unanswered_preemption_question_means_not_preempted(tmp_path: Path) -> None:
    slurm = FakeSlurm(retries=5)
    slurm.reachable = False
    assert finish(RunDir(tmp_path), tmp_path / "heartbeat" / "4242-0", JOB, 143, 3, slurm) == (143, True)
    assert slurm.calls == [["scontrol", "--oneliner", "show", "job", "4242"]], "asked once, not retried"


@pytest.mark.parametrize(
    ("code", "restarts", "verdict", "expected"),
    [
        (ExitCode.OK, 0, None, (ExitCode.OK, False)),
        # A crash (an exception, a rank killed by a signal) resumes from the newest checkpoint, within the budget.
        (ExitCode.FAILURE, 0, None, (ExitCode.FAILURE, True)),
        (137, 1, None, (137, True)),
        (ExitCode.FAILURE, 3, None, (ExitCode.FAILURE, False)),
        # What a requeue cannot change.
        (ExitCode.USAGE, 0, None, (ExitCode.USAGE, False)),
        (ExitCode.UNREACHABLE, 0, None, (ExitCode.UNREACHABLE, False)),
        (ExitCode.CRASH_LOOP, 0, None, (ExitCode.CRASH_LOOP, False)),
        *[(code, 0, None, (code, True)) for code in sorted(REQUEUE_WORTHY)],
        (ExitCode.REQUEUE, 3, None, (ExitCode.REQUEUE, False)),
        (143, 0, ExitCode.HUNG, (ExitCode.HUNG, True)),
        (ExitCode.OK, 0, ExitCode.HUNG, (ExitCode.OK, False)),
    ],
)
def test_finish_decides_on_the_exit_code_contract(
    tmp_path: Path, code: int, restarts: int, verdict: ExitCode | None, expected: tuple[int, bool]
) -> None:
    run_dir, start_dir = RunDir(tmp_path), tmp_path / "heartbeat" / "4242-0"
    if verdict is not None:
        write_exit_code(start_dir, verdict)
    slurm = FakeSlurm()
    assert finish(run_dir, start_dir, JobStart("4242", restarts, "n1", ("n1",), 4242), code, 3, slurm) == expected
    requeues = [e for e in read_jsonl(run_dir.events) if e["kind"] == "requeue"]
    assert [e["exit_code"] for e in requeues] == ([expected[0]] if expected[1] else [])
    crashed = expected[0] not in REQUEUE_WORTHY
    assert [e["reason"] for e in requeues] == (["crashed" if crashed else "requeue-worthy"] if expected[1] else [])


def test_requeue_keeps_bad_nodes_out_of_the_next_start(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path)
    run_dir.bad_nodes.write_text("n3  # hung: rank 5\n\n n1 # unhealthy\nn3\n")
    slurm = FakeSlurm()
    slurm.jobs["4242"] = FakeJob("4242", "run", 4, "", state=JobState.RUNNING)
    requeue(run_dir, JobStart("4242", 0, "n[1-4]", ("n1", "n2", "n3", "n4"), 4242), "n[1-4]", slurm)
    assert slurm.calls[-2] == ["scontrol", "requeue", "4242"]
    assert slurm.calls[-1] == ["scontrol", "update", "jobid=4242", "ExcNodeList=n1,n3", "ReqNodeList=n2,n4"]


def test_the_helper_imports_neither_torch_nor_pydantic() -> None:
    code = "import sys, air_hpc.runtime.batch; print(json.dumps(sorted({'torch', 'pydantic'} & set(sys.modules))))"
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
