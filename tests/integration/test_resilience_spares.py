"""Hot spares on the real testbed: a crashed rank or a dead node costs a restart inside the job, not a requeue.

A TP2xPP2 gpt-tiny job on two nodes with one spare (``resources.spare_nodes: 1``) loses a
rank (``kill -9``) or a whole node (its slurmd and every process it started) after the
first checkpoint, once the warm standbys are started (``resilience.warm_standby``). The supervisor
restarts the step on the spare from that checkpoint, in the same job, promoting the standbys; the
losses and the final weights equal an uninterrupted run's bit for bit. With the spare used up, the
next failure requeues the job without the bad nodes (the exit-code path).
"""

import time
from pathlib import Path
from typing import Any

import hostlist
import psutil
import pytest

from air_hpc.config.load import load_job
from air_hpc.health.badnodes import read_bad_nodes
from air_hpc.health.heartbeat import read_beats
from air_hpc.launch.submit import submit as submit_slurm
from air_hpc.records.jsonl import read_jsonl
from air_hpc.records.metrics import read_metrics
from air_hpc.records.rundir import RunDir
from air_hpc.slurm.jobs import JobState
from air_hpc.topology import treeconf
from tests.integration import test_resilience_preempt as preempt
from tests.integration.test_resilience_preempt import REPO, STEPS, job_overrides, kinds, shard_hashes
from tests.integration.waiting import wait_ended, wait_for

pytestmark = pytest.mark.integration

# The corpus and the uninterrupted reference run of the preemption tests, built once for this module too.
corpus = preempt.corpus
reference = preempt.reference


def submit_with_spare(testbed: Any, corpus: Path, tmp_path: Path, name: str) -> tuple[str, RunDir]:
    job = load_job(
        REPO / "configs/jobs/gpt-tiny-testbed.yaml",
        [
            *job_overrides(tmp_path, corpus, name),
            f"cluster.topology_file={testbed.topology_conf}",
            "resources.spare_nodes=1",
        ],
    )
    done = submit_slurm(job, "slurm", testbed.client)
    return done.job_id, RunDir(done.run_dir)


def wait_past(run_dir: RunDir, kind: str) -> None:
    """Until the running step has a ``kind`` event (checkpoint_saved, resume) and has trained a step after it."""
    wait_for("the step to start", lambda: kinds(run_dir, "step_started"), timeout_s=300)
    started = kinds(run_dir, "step_started")[-1]["time"]

    def ready() -> bool:
        marks = [e["time"] for e in kinds(run_dir, kind) if e["time"] > started]
        return bool(marks) and any(r["time"] > marks[0] for r in read_metrics(run_dir.metrics))

    wait_for(f"{kind} and a step after it", ready, timeout_s=300)


def wait_warm(run_dir: RunDir) -> None:
    """Until the standbys of the step's two nodes and the spare are started (the run is too short to wait for
    their imports: one still warming up when it is promoted finishes them first, as its start-up shows)."""
    wait_for("the warm standbys", lambda: any(run_dir.heartbeat.glob("*/standby-*")), timeout_s=300)


def last_rank(run_dir: RunDir) -> tuple[int, str]:
    """PID and node of the highest rank of the running step, from its heartbeat."""
    started = kinds(run_dir, "step_started")[-1]["generation"]
    beats = read_beats(run_dir.heartbeat / started)
    beat = beats[max(beats)]
    return beat.pid, beat.host


def kill_rank(run_dir: RunDir) -> str:
    """``kill -9`` the highest rank (checked to be this run's training process); returns its node."""
    pid, host = last_rank(run_dir)
    proc = psutil.Process(pid)
    assert "air_hpc.runtime" in proc.cmdline() and str(run_dir.path) in proc.cmdline()
    proc.kill()
    return host


def leftovers(run_dir: RunDir) -> list[str]:
    """Processes still naming the run directory (supervisor, srun, ranks) once the job ended."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if any(str(run_dir.path) in arg for arg in cmdline):
            found.append(" ".join(cmdline))
    return found


def starts(run_dir: RunDir) -> list[str]:
    return [row["nodelist"] for row in read_jsonl(run_dir.submissions) if row.get("kind") == "started"]


def check_like_reference(run_dir: RunDir, reference: RunDir) -> None:
    expected = [(r["step"], r["loss"]) for r in read_metrics(reference.metrics)]
    assert len(expected) == STEPS
    assert [(r["step"], r["loss"]) for r in read_metrics(run_dir.metrics)] == expected
    assert shard_hashes(run_dir, STEPS) == shard_hashes(reference, STEPS)
    saved = {e["step"] for e in kinds(run_dir, "checkpoint_saved")}
    assert all(e["step"] in saved for e in kinds(run_dir, "resume"))  # resumed from a complete checkpoint


def check_restarted_in_job(testbed: Any, run_dir: RunDir, failed: str, reason: str) -> None:
    (restart,) = kinds(run_dir, "in_job_restart")
    ((old, spare),) = restart["replaced"].items()
    assert old == failed and reason in restart["reason"], restart
    fabric = treeconf.parse(testbed.topology_conf.read_text(), str(testbed.topology_conf))
    assert fabric.leaf_of[spare] == fabric.leaf_of[failed]  # the spare on the failed node's leaf
    assert len(starts(run_dir)) == 1  # no requeue: the same start of the same job
    assert read_bad_nodes(run_dir.bad_nodes) == (failed,)
    assert [(e["attempt"], e["warm"]) for e in kinds(run_dir, "step_started")] == [(0, False), (1, True)]
    assert [e["exit_code"] for e in kinds(run_dir, "step_ended")][-1] == 0
    assert len(kinds(run_dir, "resume")) == 1


def report_recovery(run_dir: RunDir, faulted_at: float) -> None:
    resumed = kinds(run_dir, "resume")[-1]["step"]
    first = next(r for r in read_metrics(run_dir.metrics) if r["step"] == resumed + 1)
    print(f"fault to first resumed step: {first['time'] - faulted_at:.1f} s")


def test_crashed_rank_restarts_on_the_spare_in_the_same_job(
    testbed: Any, corpus: Path, reference: RunDir, tmp_path: Path
) -> None:
    job_id, run_dir = submit_with_spare(testbed, corpus, tmp_path, "rank-crash")
    wait_past(run_dir, "checkpoint_saved")
    wait_warm(run_dir)
    faulted_at = time.time()
    failed = kill_rank(run_dir)
    status = wait_ended(testbed.client, job_id, 400)
    assert status.state == JobState.COMPLETED, "\n".join(p.read_text()[-1500:] for p in run_dir.logs.glob("*.err"))
    check_restarted_in_job(testbed, run_dir, failed, "rank crash")
    check_like_reference(run_dir, reference)
    wait_for("no process left behind", lambda: not leftovers(run_dir), timeout_s=30)
    report_recovery(run_dir, faulted_at)


def test_dead_node_restarts_on_the_spare_in_the_same_job(
    testbed: Any, corpus: Path, reference: RunDir, tmp_path: Path
) -> None:
    job_id, run_dir = submit_with_spare(testbed, corpus, tmp_path, "node-death")
    wait_past(run_dir, "checkpoint_saved")
    wait_warm(run_dir)
    pid, failed = last_rank(run_dir)
    batch_host = hostlist.expand_hostlist(starts(run_dir)[0])[0]
    assert failed != batch_host  # rank 3 is placed on the second node; the batch script runs on the first
    faulted_at = time.time()
    killed = testbed.testbed.kill_node(failed)
    assert pid in killed
    try:
        wait_for("the restart on the spare to resume", lambda: kinds(run_dir, "resume"), timeout_s=300)
    finally:
        testbed.testbed.restart_node(failed)
    status = wait_ended(testbed.client, job_id, 300)
    assert status.state == JobState.COMPLETED, "\n".join(p.read_text()[-1500:] for p in run_dir.logs.glob("*.err"))
    check_restarted_in_job(testbed, run_dir, failed, "node death")
    (ended,) = [e for e in kinds(run_dir, "step_ended") if e["dead_nodes"]]
    assert ended["dead_nodes"] == [failed]
    check_like_reference(run_dir, reference)
    report_recovery(run_dir, faulted_at)


def test_spares_used_up_requeue_without_the_bad_nodes(
    testbed: Any, corpus: Path, reference: RunDir, tmp_path: Path
) -> None:
    job_id, run_dir = submit_with_spare(testbed, corpus, tmp_path, "exhausted")
    failed = []
    # The first crash after a checkpoint takes the spare; the second, right after the resume, finds none.
    for after in ("checkpoint_saved", "resume"):
        wait_past(run_dir, after)
        failed.append(kill_rank(run_dir))
        ended = len(failed)
        wait_for("the step to end", lambda n=ended: len(kinds(run_dir, "step_ended")) >= n, timeout_s=120)
    status = wait_ended(testbed.client, job_id, 400)
    assert status.state == JobState.COMPLETED, "\n".join(p.read_text()[-1500:] for p in run_dir.logs.glob("*.err"))
    (exhausted,) = kinds(run_dir, "spares_exhausted")
    assert exhausted["failed"] == [failed[1]] and exhausted["spares"] == []
    assert read_bad_nodes(run_dir.bad_nodes) == tuple(sorted(failed))
    first, second = starts(run_dir)
    assert not set(failed) & set(hostlist.expand_hostlist(second)), (first, second)
    assert [e["exit_code"] for e in kinds(run_dir, "requeue")] == [87]
    check_like_reference(run_dir, reference)
    wait_for("no process left behind", lambda: not leftovers(run_dir), timeout_s=30)


def test_preemption_under_the_supervisor_saves_and_requeues(
    testbed: Any, corpus: Path, reference: RunDir, tmp_path: Path
) -> None:
    """The batch shell forwards the signal to the supervisor, which forwards it to the step: after a crash, the
    promoted standbys, each of which passes it to the ranks it forked. A stop is never restarted."""
    job_id, run_dir = submit_with_spare(testbed, corpus, tmp_path, "preempted")
    wait_past(run_dir, "checkpoint_saved")
    wait_warm(run_dir)
    kill_rank(run_dir)
    wait_past(run_dir, "resume")
    testbed.client.scancel(job_id, signal="USR2", batch=True)
    status = wait_ended(testbed.client, job_id, 400)
    assert status.state == JobState.COMPLETED, "\n".join(p.read_text()[-1500:] for p in run_dir.logs.glob("*.err"))
    assert [e["reason"] for e in kinds(run_dir, "stop")] == ["signal"]
    assert [e["exit_code"] for e in kinds(run_dir, "requeue")] == [85]
    assert [(e["attempt"], e["warm"]) for e in kinds(run_dir, "step_started")][:2] == [(0, False), (1, True)]
    assert len(kinds(run_dir, "in_job_restart")) == 1
    assert len(starts(run_dir)) == 2
    check_like_reference(run_dir, reference)
