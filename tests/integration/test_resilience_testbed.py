"""A testbed job preempted twice (``scancel --signal=USR2 --batch``) finishes on its own with identical losses.

The batch shell gets the signal, forwards it to the ``srun`` step, the ranks agree, save,
exit with the requeue code, the batch script requeues, and the next start resumes. The
losses are compared with the same TP2xPP2 run on one machine through LocalExecutor.
"""

import time
from pathlib import Path
from typing import Any

import pytest

from air_hpc.config import load_job
from air_hpc.exitcodes import ExitCode
from air_hpc.launch.submit import submit
from air_hpc.rundir import RunDir
from air_hpc.train import data
from air_hpc.train.metrics import read_metrics
from tests.integration.test_resilience_preempt import job_overrides, kinds, last_step, wait_for
from tests.integration.test_resilience_preempt import submit as submit_local

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_testbed_job_preempted_twice_finishes_with_identical_losses(testbed: Any, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.h5"
    data.prepare(data.project_sources(), corpus, data.ByteTokenizer())
    steps = "train.steps=10"  # room for two stops that land a few steps after their signals
    reference, handle = submit_local(
        tmp_path, corpus, "reference", "gpt-tiny-testbed.yaml", steps, "resources.nodes=1", "resources.tasks_per_node=4"
    )
    assert [r.exit_code for r in handle.results()] == [ExitCode.OK] * 4

    job = load_job(
        REPO / "configs/jobs/gpt-tiny-testbed.yaml",
        [*job_overrides(tmp_path, corpus, "testbed"), steps, f"cluster.topology_file={testbed.topology_conf}"],
    )
    done = submit(job, "slurm", testbed.client)
    run_dir = RunDir(done.run_dir)

    signalled: list[float] = []
    for round_ in range(2):
        resumed = kinds(run_dir, "resume")
        since = resumed[-1]["step"] if resumed else 0
        wait_for(f"step {since + 1}", lambda since=since: last_step(run_dir) >= since + 1, timeout_s=300)
        signalled.append(time.time())
        testbed.client.scancel(done.job_id, signal="USR2", batch=True)
        wait_for(f"resume {round_ + 1}", lambda n=round_ + 1: len(kinds(run_dir, "resume")) >= n, timeout_s=300)
    state = testbed.wait_job(done.job_id, timeout_s=300)
    logs = "\n".join(p.read_text()[-1500:] for p in sorted(run_dir.logs.glob("*")))
    assert state == "COMPLETED", logs

    records = read_metrics(run_dir.metrics)
    expected = [(r["step"], r["loss"]) for r in read_metrics(reference.metrics)]
    assert [(r["step"], r["loss"]) for r in records] == expected, logs
    stops, resumes = kinds(run_dir, "stop"), kinds(run_dir, "resume")
    assert [e["reason"] for e in stops] == ["signal", "signal"]
    assert [e["step"] for e in resumes] == [e["step"] for e in stops]  # no step lost
    for sent, stop in zip(signalled, stops, strict=True):
        first_resumed = next(r for r in records if r["step"] == stop["step"] + 1)
        seconds = first_resumed["time"] - sent
        print(f"signal at step {stop['step']}: first resumed step {seconds:.1f} s later")
        assert seconds < 120
