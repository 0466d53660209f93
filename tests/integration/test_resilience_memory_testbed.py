"""In-memory snapshots on the real testbed: a rank or node failure costs at most a step, bit for bit.

gpt-tiny TP2xPP2 on two nodes with one spare and ``checkpoint.memory_interval_steps: 1`` (the
persistent checkpoint every 3 steps). A rank is killed (``kill -9``) or a whole node dies (its
slurmd and every process it started, the node's snapshot holder included) between two persistent
checkpoints. The supervisor restarts the step on the spare; the ranks resume from the newest
snapshot complete across ranks: a dead node's shards come from the buddy copies on the other
node. At most one step is redone, and the losses and final weights equal an uninterrupted run's.
"""

import time
from pathlib import Path
from typing import Any

import hostlist
import pytest

from air_hpc.config.load import load_job
from air_hpc.launch.submit import submit as submit_slurm
from air_hpc.records.metrics import read_metrics
from air_hpc.records.rundir import RunDir
from air_hpc.slurm.jobs import JobState
from tests.integration import test_resilience_preempt as preempt
from tests.integration.test_resilience_preempt import REPO, STEPS, job_overrides, kinds, last_step, shard_hashes
from tests.integration.test_resilience_spares import kill_rank, last_rank, leftovers, starts
from tests.integration.waiting import wait_ended, wait_for

pytestmark = pytest.mark.integration

corpus = preempt.corpus
reference = preempt.reference


def submit_with_snapshots(testbed: Any, corpus: Path, tmp_path: Path, name: str) -> tuple[str, RunDir]:
    job = load_job(
        REPO / "configs/jobs/gpt-tiny-testbed.yaml",
        [
            *job_overrides(tmp_path, corpus, name),
            f"cluster.topology_file={testbed.topology_conf}",
            "resources.spare_nodes=1",
            "checkpoint.memory_interval_steps=1",
        ],
    )
    done = submit_slurm(job, "slurm", testbed.client)
    return done.job_id, RunDir(done.run_dir)


def wait_between_checkpoints(run_dir: RunDir) -> int:
    """Until step 4 or 5 is trained (after the checkpoint of step 3, before that of step 6); returns the last step."""
    wait_for("step 4", lambda: last_step(run_dir) >= 4, timeout_s=600)
    return last_step(run_dir)


def check_resumed_from_memory(run_dir: RunDir, reference: RunDir, trained: int) -> dict[str, Any]:
    (resumed,) = kinds(run_dir, "memory_resume")
    assert resumed["step"] >= trained - 1, (resumed, trained)  # at most one step lost
    assert not kinds(run_dir, "resume")  # the persistent checkpoint was not needed
    assert not kinds(run_dir, "snapshot_skipped")
    expected = [(r["step"], r["loss"]) for r in read_metrics(reference.metrics)]
    assert [(r["step"], r["loss"]) for r in read_metrics(run_dir.metrics)] == expected
    assert shard_hashes(run_dir, STEPS) == shard_hashes(reference, STEPS)
    assert len(starts(run_dir)) == 1  # the same start of the same job
    return dict(resumed)


def test_rank_kill_resumes_from_memory_losing_at_most_a_step(
    testbed: Any, corpus: Path, reference: RunDir, tmp_path: Path
) -> None:
    job_id, run_dir = submit_with_snapshots(testbed, corpus, tmp_path, "mem-rank-kill")
    trained = wait_between_checkpoints(run_dir)
    faulted_at = time.time()
    kill_rank(run_dir)
    status = wait_ended(testbed.client, job_id, 400)
    assert status.state == JobState.COMPLETED, "\n".join(p.read_text()[-1500:] for p in run_dir.logs.glob("*.err"))
    resumed = check_resumed_from_memory(run_dir, reference, trained)
    (buddies,) = kinds(run_dir, "snapshot_buddies")[:1]
    assert buddies["refused"] is None and buddies["buddies"] == {"0": 2, "1": 3, "2": 0, "3": 1}
    wait_for("no process left behind", lambda: not leftovers(run_dir), timeout_s=30)
    first = next(r for r in read_metrics(run_dir.metrics) if r["step"] == resumed["step"] + 1)
    print(f"fault to first resumed step (memory): {first['time'] - faulted_at:.1f} s")


def test_node_kill_takes_the_dead_nodes_shards_from_their_buddies(
    testbed: Any, corpus: Path, reference: RunDir, tmp_path: Path
) -> None:
    job_id, run_dir = submit_with_snapshots(testbed, corpus, tmp_path, "mem-node-kill")
    trained = wait_between_checkpoints(run_dir)
    pid, failed = last_rank(run_dir)
    batch_host = hostlist.expand_hostlist(starts(run_dir)[0])[0]
    assert failed != batch_host
    faulted_at = time.time()
    killed = testbed.testbed.kill_node(failed)
    assert pid in killed
    try:
        wait_for("the restart to resume", lambda: kinds(run_dir, "memory_resume"), timeout_s=300)
    finally:
        testbed.testbed.restart_node(failed)
    status = wait_ended(testbed.client, job_id, 300)
    assert status.state == JobState.COMPLETED, "\n".join(p.read_text()[-1500:] for p in run_dir.logs.glob("*.err"))
    resumed = check_resumed_from_memory(run_dir, reference, trained)
    (restart,) = kinds(run_dir, "in_job_restart")
    spare = restart["replaced"][failed]
    assert resumed["sources"]["2"] == resumed["sources"]["3"] == batch_host  # the buddies' copies
    assert spare not in resumed["sources"].values()
    first = next(r for r in read_metrics(run_dir.metrics) if r["step"] == resumed["step"] + 1)
    print(f"fault to first resumed step (memory, node loss): {first['time'] - faulted_at:.1f} s")


def test_second_crash_after_the_spare_is_used_resumes_from_memory_in_place(
    testbed: Any, corpus: Path, reference: RunDir, tmp_path: Path
) -> None:
    """Two in-job restarts in a row: the first crash takes the only spare; the second, with none left, restarts
    the step on the same (live) nodes from the snapshots instead of requeueing, which would lose the holders
    and go back to the persistent checkpoint (or to step 0 when a killed save left none)."""
    job_id, run_dir = submit_with_snapshots(testbed, corpus, tmp_path, "mem-two-crashes")
    trained = [wait_between_checkpoints(run_dir)]
    kill_rank(run_dir)
    wait_for("the first restart to resume", lambda: kinds(run_dir, "memory_resume"), timeout_s=300)
    resumed_at = kinds(run_dir, "memory_resume")[0]["step"]
    wait_for("a step after the resume", lambda: last_step(run_dir) > resumed_at, timeout_s=300)
    trained.append(last_step(run_dir))
    faulted_at = time.time()
    kill_rank(run_dir)
    status = wait_ended(testbed.client, job_id, 400)
    assert status.state == JobState.COMPLETED, "\n".join(p.read_text()[-1500:] for p in run_dir.logs.glob("*.err"))
    resumes = kinds(run_dir, "memory_resume")
    assert len(resumes) == 2, resumes
    for resumed, reached in zip(resumes, trained, strict=True):
        assert resumed["step"] >= reached - 1, (resumes, trained)  # at most one step lost each time
    assert not kinds(run_dir, "resume") and not kinds(run_dir, "requeue")
    assert len(starts(run_dir)) == 1  # the same start of the same job
    first, second = kinds(run_dir, "in_job_restart")
    assert first["replaced"] and not second["replaced"] and second["spares_left"] == []
    assert not kinds(run_dir, "spares_exhausted")
    expected = [(r["step"], r["loss"]) for r in read_metrics(reference.metrics)]
    assert [(r["step"], r["loss"]) for r in read_metrics(run_dir.metrics)] == expected
    assert shard_hashes(run_dir, STEPS) == shard_hashes(reference, STEPS)
    wait_for("no process left behind", lambda: not leftovers(run_dir), timeout_s=30)
    again = next(r for r in read_metrics(run_dir.metrics) if r["step"] == resumes[1]["step"] + 1)
    print(f"second crash to first resumed step (memory, in place): {again['time'] - faulted_at:.1f} s")
