"""The report's wall-time breakdown (its parts sum to the wall time) and its GPU-hours and cost."""

import dataclasses
import json
from pathlib import Path

import pytest

from air_hpc.observe.records import load_records
from air_hpc.observe.report import build_report, format_report
from tests.unit.test_observe_report import preempted_run


def submitted_at(run_dir_path: Path, time_s: float) -> None:
    line = {"event": "submitted", "job_id": "7", "executor": "slurm", "time": time_s}
    (run_dir_path / "submissions.jsonl").write_text(json.dumps(line) + "\n")


def test_the_parts_add_up_to_the_wall_time(tmp_path: Path) -> None:
    """Submitted at 990, started at 1000, steps 1-8 from 1002, preempted at 1010.5, back at 1033, done 1038.5."""
    run_dir = preempted_run(tmp_path)
    submitted_at(run_dir.path, 990.0)
    report = build_report(load_records(run_dir))
    assert report is not None
    parts = report.breakdown
    assert report.wall_s == pytest.approx(48.5)
    assert parts.wall_s == pytest.approx(report.wall_s)
    assert dataclasses.asdict(parts) == pytest.approx(
        {
            "queue_wait_s": 10.0,
            "startup_s": 2.0,
            "productive_s": 10.0,
            "checkpoint_stall_s": 0.1,  # the save at 1007.2 fell in work that was lost: counted there
            "lost_work_s": 3.5,
            "restart_latency_s": 22.5,
            "other_s": 0.4,
        }
    )
    assert report.goodput == pytest.approx(10.0 / 48.5)
    text = format_report(report)
    assert "wall time    48.5 s since the first submission" in text
    assert "  queue wait           10.0 s  20.6%  submission to the first start" in text
    assert "  start-up              2.0 s   4.1%" in text


def test_without_a_recorded_submission_the_wall_starts_at_the_first_start(tmp_path: Path) -> None:
    run_dir = preempted_run(tmp_path)
    submitted_at(run_dir.path, 5000.0)  # a later resubmission's clock says nothing about this start
    report = build_report(load_records(run_dir))
    assert report is not None
    assert report.breakdown.queue_wait_s == 0.0 and report.wall_s == pytest.approx(38.5)
    assert sum(dataclasses.asdict(report.breakdown).values()) == pytest.approx(38.5)


def test_gpu_hours_used_lost_and_their_cost(tmp_path: Path) -> None:
    run_dir = preempted_run(tmp_path)
    submitted_at(run_dir.path, 990.0)
    records = dataclasses.replace(load_records(run_dir), gpus=16, usd_per_gpu_hour=3.0)
    report = build_report(records)
    assert report is not None
    cost = report.cost
    # Allocated: 48.5 s wall - 10 s queue - 19.5 s between the signal (last record of start 1) and start 2.
    assert cost.allocated_s == pytest.approx(19.0)
    assert cost.gpu_hours_used == pytest.approx(16 * 19.0 / 3600)
    assert cost.gpu_hours_lost == pytest.approx(16 * 9.0 / 3600)
    assert cost.usd_used == pytest.approx(3.0 * 16 * 19.0 / 3600)
    assert cost.usd_lost == pytest.approx(3.0 * 16 * 9.0 / 3600)
    line = format_report(report).splitlines()[-1]
    assert line == (
        "GPU-hours    0.08 used (16 GPUs x 0.005 h allocated), 0.04 lost (47.4% of used); "
        "cost $0.25, of which $0.12 lost (at $3.0/GPU-h)"
    )
    no_price = build_report(dataclasses.replace(records, usd_per_gpu_hour=None))
    assert no_price is not None and format_report(no_price).endswith("; no price (hardware.usd_per_gpu_hour)")
    cpu = build_report(load_records(run_dir))
    assert cpu is not None and format_report(cpu).splitlines()[-1].startswith("GPU-hours    none: CPU hardware")


def test_the_price_comes_from_the_hardware_profile(tmp_path: Path) -> None:
    from air_hpc.config import load_job
    from air_hpc.records.rundir import RunDir
    from tests.unit.test_observe_report import REPO

    job = load_job(
        REPO / "configs" / "jobs" / "gpt-tiny-local.yaml",
        [f"run.root={tmp_path}", "hardware=h100-sxm", "resources.tasks_per_node=8", "hardware.usd_per_gpu_hour=2.5"],
    )
    run_dir = RunDir.of(job)
    run_dir.write_job(job)
    records = load_records(run_dir)
    assert (records.gpus, records.usd_per_gpu_hour) == (8, 2.5)


def test_the_plot_shades_start_up_and_smooths_throughput(tmp_path: Path) -> None:
    from air_hpc.observe.plot import running_median, startup_spans

    records = load_records(preempted_run(tmp_path))
    report = build_report(records)
    assert report is not None
    # Each start to its first step: 1000 -> 1002, and 1030 -> 1033 (after the restart).
    assert startup_spans(records, report) == [(1000.0, 1002.0), (1030.0, 1033.0)]
    assert running_median([1.0, 100.0, 3.0, 4.0, 5.0, 6.0]) == [3.0, 3.5, 4.0, 5.0, 4.5, 5.0]
