"""Report and plot of a real run, recorded: gpt-tiny TP2xPP2 on two testbed nodes, preempted with USR2
through its batch script at step 16 (saved there), requeued, resumed from 16 and finished at 30."""

from dataclasses import asdict
from pathlib import Path

import pytest

from air_hpc.observe.plot import plot_run
from air_hpc.observe.progress import run_progress
from air_hpc.observe.records import load_records
from air_hpc.observe.report import build_report
from air_hpc.records.rundir import RunDir

RECORDED = RunDir(Path(__file__).parent.parent / "data" / "observe" / "preempted")


def test_recorded_preemption_report() -> None:
    records = load_records(RECORDED)
    assert records.starts_s == (1796219778.0, 1796219810.0)  # the batch script's starts, start-up included
    report = build_report(records)
    assert report is not None
    assert (report.steps_done, report.total_steps, report.checkpoints) == (30, 30, 7)
    # The two saves at the stop (steps 15 and 16) belong to the restart, not to the checkpoint overhead.
    assert report.checkpoint_stall_s == pytest.approx(0.114 + 0.1422 + 0.092 + 0.0898 + 0.3518)
    # Wall time from the submission: 0.17 s in the queue, then 49.94 s from the first start.
    assert report.wall_s == pytest.approx(50.11, abs=0.01)
    parts = report.breakdown
    assert parts.queue_wait_s == pytest.approx(0.17, abs=0.01)
    assert parts.startup_s == pytest.approx(11.44, abs=0.01)  # start-up is a fifth of this short run
    assert parts.restart_latency_s == pytest.approx(29.76, abs=0.01)
    assert parts.wall_s == pytest.approx(report.wall_s)
    assert min(asdict(parts).values()) >= 0
    assert report.goodput == pytest.approx(report.productive_s / report.wall_s)
    assert 0.13 < (report.goodput or 0) < 0.15
    (restart,) = report.restarts
    # Saved at the stop: nothing to train again; the time went to the save, the requeue and start-up.
    assert (restart.cause, restart.lost_steps) == ("preemption", 0)
    assert restart.interrupted_s == pytest.approx(1796219794.136, abs=1e-3)
    assert restart.latency_s == pytest.approx(29.76, abs=0.01)
    progress = run_progress(records, now_s=report.last_activity_s)
    assert progress is not None and (progress.step, progress.restarts, progress.last_checkpoint_step) == (30, 1, 30)


def test_recorded_preemption_plot(tmp_path: Path) -> None:
    records = load_records(RECORDED)
    report = build_report(records)
    assert report is not None
    png = plot_run(records, report, tmp_path / "preempted.png", "preempted")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 30_000
