"""gpt-tiny across two emulated nodes of the Slurm testbed: sbatch, srun, ``python -m air_hpc.runtime``.

Two runs of the rendered batch script with the real trainer, 2 nodes x 2 tasks each (TP2 x PP2,
gloo over loopback), side by side: one uninterrupted; one sent USR2 through the batch shell
midway, which must checkpoint, exit with the requeue code, be requeued by its batch script,
resume and finish with the same losses bit for bit.
"""

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from air_hpc.config import load_job
from air_hpc.launch.submit import Submission, submit
from air_hpc.records.events import read_events
from air_hpc.records.metrics import read_metrics
from air_hpc.records.rundir import RunDir
from air_hpc.train import data
from tests.integration.waiting import wait_ended

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
STEPS = 8


def start(testbed: Any, tmp_path: Path, corpus: Path, name: str) -> Submission:
    job = load_job(
        REPO / "configs/jobs/gpt-tiny-testbed.yaml",
        [
            f"run.root={tmp_path}",
            f"run.name={name}",
            f"data.path={corpus}",
            f"train.steps={STEPS}",
            "checkpoint.interval_steps=100",
            f"cluster.topology_file={testbed.topology_conf}",
            "health.preflight=false",
        ],
    )
    return submit(job, "slurm", testbed.client)


def wait_done(testbed: Any, submission: Submission, timeout_s: float = 300) -> str:
    return str(wait_ended(testbed.client, submission.job_id, timeout_s, poll_s=1).state)


def all_logs(run_dir: RunDir) -> str:
    return "\n".join(p.read_text()[-3000:] for p in sorted(run_dir.logs.glob("*")))


def test_gpt_tiny_on_two_nodes_survives_a_preemption_bit_for_bit(testbed: Any, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.h5"
    data.prepare(data.project_sources(), corpus, data.ByteTokenizer())
    reference = start(testbed, tmp_path, corpus, "reference")
    preempted = start(testbed, tmp_path, corpus, "preempted")
    run = RunDir(preempted.run_dir)
    deadline = time.monotonic() + 240
    while len(read_metrics(run.metrics)) < 2:
        assert time.monotonic() < deadline, all_logs(run)
        time.sleep(0.5)
    testbed.client.scancel(preempted.job_id, signal="USR2", batch=True)

    ref_run = RunDir(reference.run_dir)
    assert wait_done(testbed, reference) == "COMPLETED", all_logs(ref_run)
    assert wait_done(testbed, preempted) == "COMPLETED", all_logs(run)
    losses = [r["loss"] for r in read_metrics(ref_run.metrics)]
    assert [r["step"] for r in read_metrics(ref_run.metrics)] == list(range(1, STEPS + 1))
    assert losses[-1] < losses[0] - 0.2
    assert [r["loss"] for r in read_metrics(run.metrics)] == losses

    events = read_events(run.events)
    stop = next(e for e in events if e["kind"] == "stop")
    resume = next(e for e in events if e["kind"] == "resume")
    assert stop["reason"] == "signal" and resume["step"] == stop["step"] and resume["rng_restored"]
    hosts = set()
    for rank in range(4):
        first = ref_run.rank_log(rank).read_text().splitlines()[0]
        assert f"rank={rank} " in first and f"rank {rank} of 4 on " in first, first
        hosts.add(first.split(" of 4 on ")[1].split()[0])
    assert len(hosts) == 2, hosts


def signal_as_it_starts(testbed: Any, submission: Submission, delay_s: float | None) -> float:
    """Send USR2 to the batch shell ``delay_s`` after the job turns RUNNING, or (None) the moment its first rank
    is armed (a fixed delay would race a two-step run on an idle machine); returns when it was sent."""
    deadline = time.monotonic() + 120
    while True:
        status = testbed.client.job_status(submission.job_id)
        if status is not None and status.state.name == "RUNNING":
            break
        assert time.monotonic() < deadline, f"job {submission.job_id} did not start: {status}"
        time.sleep(0.02)
    if delay_s is None:
        while not any(RunDir(submission.run_dir).heartbeat.glob("*/armed-[0-9]*")):
            assert time.monotonic() < deadline, f"job {submission.job_id}: no rank armed"
            time.sleep(0.02)
    else:
        time.sleep(delay_s)
    testbed.client.scancel(submission.job_id, signal="USR2", batch=True)
    return time.time()


def test_a_stop_signal_as_the_job_starts_ends_in_a_requeue_never_failed(
    testbed: Any, tmp_path: Path, small_corpus: Path
) -> None:
    """The batch shell traps the signal on its first line; ranks hold it until their handler exists."""
    delays_s = (0.0, 1.5, None)  # the batch shell's first lines, ranks importing, the first rank armed
    runs = []
    for index in range(len(delays_s)):
        job = load_job(
            REPO / "configs/jobs/gpt-tiny-testbed.yaml",
            [
                f"run.root={tmp_path}",
                f"run.name=early-{index}",
                f"data.path={small_corpus}",
                "resources.nodes=1",
                "parallel.pp=1",
                "train.steps=2",
                "train.lr_warmup_steps=0",
                "resilience.max_restarts=2",
                "health.preflight=false",
            ],
        )
        runs.append(submit(job, "slurm", testbed.client))
    with ThreadPoolExecutor(len(runs)) as pool:
        list(pool.map(lambda pair: signal_as_it_starts(testbed, *pair), zip(runs, delays_s, strict=True)))
    for submission in runs:
        run = RunDir(submission.run_dir)
        assert wait_done(testbed, submission) == "COMPLETED", all_logs(run)
        signals = [e for e in read_events(run.events) if e["kind"] == "signal"]
        assert len(signals) == 1, all_logs(run)  # the batch shell saw the signal and forwarded it once
        assert [r["step"] for r in read_metrics(run.metrics)][-1] == 2
