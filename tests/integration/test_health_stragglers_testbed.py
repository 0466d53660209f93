"""A node slowed by stopping and continuing its ranks is reported as a straggler and left out of the next start.

gpt-tiny TP2xPP2 on two testbed nodes; once it trains, the ranks of one node are stopped
(SIGSTOP) three quarters of the time on a short duty cycle, identified by the PID and host in
their heartbeat files and by their process start time. The ranks must report that node in a
``straggler`` event and on the bad-node list (``health.exclude_stragglers``); ``status`` and
the report must name it; and after a preemption the requeued start must run without it and
finish.
"""

import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from air_hpc.config import load_job
from air_hpc.health.badnodes import read_bad_nodes
from air_hpc.health.heartbeat import Beat, read_beats
from air_hpc.launch.submit import submit
from air_hpc.observe.progress import run_progress
from air_hpc.observe.records import load_records
from air_hpc.observe.report import build_report, format_report
from air_hpc.records.events import read_events
from air_hpc.records.generation import generation_dir
from air_hpc.records.jsonl import read_jsonl
from air_hpc.records.metrics import read_metrics
from air_hpc.records.rundir import RunDir
from air_hpc.train import data
from tests.integration.waiting import wait_ended, wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
STEPS = 30
WINDOW = 5


def rank_processes(beats: dict[int, Beat], host: str) -> list[psutil.Process]:
    """The rank processes on ``host``: the PID of each heartbeat, checked to be that rank (started before its beat)."""
    processes = []
    for beat in beats.values():
        if beat.host != host:
            continue
        process = psutil.Process(beat.pid)
        assert process.create_time() <= beat.time_s + 1, f"pid {beat.pid} is not rank {beat.rank} any more"
        assert "air_hpc.runtime" in " ".join(process.cmdline())
        processes.append(process)
    return processes


def duty_cycle(
    processes: list[psutil.Process], stop: threading.Event, stopped_s: float = 0.3, run_s: float = 0.1
) -> None:
    """Stop the processes ``stopped_s`` of every ``stopped_s + run_s``, until ``stop`` is set; leave them running."""
    try:
        while not stop.is_set():
            for process in processes:
                with contextlib.suppress(psutil.Error):
                    os.kill(process.pid, signal.SIGSTOP)
            stop.wait(stopped_s)
            for process in processes:
                with contextlib.suppress(psutil.Error):
                    os.kill(process.pid, signal.SIGCONT)
            stop.wait(run_s)
    finally:
        for process in processes:
            with contextlib.suppress(psutil.Error):
                os.kill(process.pid, signal.SIGCONT)


def test_a_slowed_node_is_reported_and_left_out_of_the_next_start(testbed: Any, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.h5"
    data.prepare(data.project_sources(), corpus, data.ByteTokenizer())
    job = load_job(
        REPO / "configs/jobs/gpt-tiny-testbed.yaml",
        [
            f"run.root={tmp_path}",
            f"data.path={corpus}",
            f"train.steps={STEPS}",
            "checkpoint.interval_steps=100",
            f"cluster.topology_file={testbed.topology_conf}",
            "health.preflight=false",
            f"health.straggler_window_steps={WINDOW}",
            "health.straggler_ratio=2",
            "health.exclude_stragglers=true",
        ],
    )
    done = submit(job, "slurm", testbed.client)
    run = RunDir(done.run_dir)
    wait_for("the first step", lambda: read_metrics(run.metrics), timeout_s=240, poll_s=0.5)
    beats = read_beats(generation_dir(run, f"{done.job_id}-0.0"))
    assert len(beats) == 4, beats
    slow = beats[0].host
    processes = rank_processes(beats, slow)
    assert len(processes) == 2

    stop = threading.Event()
    slower = threading.Thread(target=duty_cycle, args=(processes, stop), daemon=True)
    slower.start()
    try:

        def reported() -> bool:
            return any(e["kind"] == "straggler" for e in read_events(run.events))

        wait_for("a straggler event", reported, timeout_s=300, poll_s=0.5)
    finally:
        stop.set()
        slower.join()
    (event,) = [e for e in read_events(run.events) if e["kind"] == "straggler"]
    assert event["node"] == slow and event["excluded"] is True and event["ratio"] > 2, event
    assert set(event["ranks"]) <= {b.rank for b in beats.values() if b.host == slow}
    assert read_bad_nodes(run.bad_nodes) == (slow,)
    progress = run_progress(load_records(run), time.time())
    assert progress is not None and f"straggler(s) {slow}" in progress.describe()

    testbed.client.scancel(done.job_id, signal="USR2", batch=True)
    assert wait_ended(testbed.client, done.job_id, timeout_s=300).state == "COMPLETED"
    starts = [r for r in read_jsonl(run.submissions) if r.get("kind") == "started"]
    assert len(starts) == 2, starts
    assert slow not in testbed.client.run(["scontrol", "show", "hostnames", starts[-1]["nodelist"]]).stdout.split()
    assert [r["step"] for r in read_metrics(run.metrics)] == list(range(1, STEPS + 1))
    report = build_report(load_records(run))
    assert report is not None and f"straggler    {slow} at step" in format_report(report)
