import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from air_hpc.cli.main import cli
from air_hpc.config import load_job
from air_hpc.observe.progress import format_duration, progress_view, run_progress
from air_hpc.observe.records import load_records
from air_hpc.observe.report import build_report, format_report
from air_hpc.records.rundir import RunDir

REPO = Path(__file__).parent.parent.parent


def preempted_run(root: Path) -> RunDir:
    """A run of 20 steps of 1 s: preempted after step 8 (checkpoint at 5), resumed 20 s later, now at step 10."""
    job = load_job(REPO / "configs" / "jobs" / "gpt-tiny-local.yaml", [f"run.root={root}"])
    run_dir = RunDir.of(job)
    run_dir.write_job(job)
    first = [(k, 1002 + k) for k in range(1, 9)]
    second = [(k, 1033 + k - 5) for k in range(6, 11)]
    run_dir.metrics.write_text(
        "".join(
            json.dumps({"step": k, "loss": 5.0 - 0.1 * k, "tokens_per_s": 1000.0 + k, "step_time_s": 1.0, "time": t})
            + "\n"
            for k, t in first + second
        )
    )
    events = [
        {"time": 1000.0, "kind": "start", "generation": "7-0"},
        {"time": 1007.2, "kind": "checkpoint_saved", "step": 5, "stall_s": 0.2, "seconds": 0.5},
        {"time": 1010.5, "kind": "signal", "signal": "SIGUSR2"},
        {"time": 1030.0, "kind": "start", "generation": "7-1"},
        {"time": 1032.0, "kind": "resume", "step": 5},
        {"time": 1038.5, "kind": "checkpoint_saved", "step": 10, "stall_s": 0.1, "seconds": 0.4},
    ]
    run_dir.events.write_text("".join(json.dumps(e) + "\n" for e in events) + '{"time": 10')
    return run_dir


def test_goodput_and_what_the_restart_cost(tmp_path: Path) -> None:
    report = build_report(load_records(preempted_run(tmp_path)))
    assert report is not None
    assert report.first_start_s == 1000.0 and report.last_activity_s == 1038.5
    assert report.wall_s == pytest.approx(38.5)
    assert report.productive_s == pytest.approx(10.0)
    assert report.goodput == pytest.approx(10.0 / 38.5)
    assert (report.steps_done, report.total_steps) == (10, 20)
    (restart,) = report.restarts
    assert (restart.cause, restart.lost_steps, restart.interrupted_s, restart.resumed_s) == (
        "preemption",
        3,
        1010.5,
        1033.0,
    )
    assert restart.lost_compute_s == pytest.approx(3.5)  # from the end of step 5 (resumed from) to the signal
    assert restart.latency_s == pytest.approx(22.5)
    assert restart.lost_s == pytest.approx(26.0)
    assert report.checkpoints == 2
    assert report.checkpoint_stall_s == pytest.approx(0.3)
    assert report.checkpoint_write_s == pytest.approx(0.9)
    text = format_report(report)
    assert "goodput      26.0%" in text
    assert "#1 preemption lost 3 step(s) (3.5 s) + restart latency 22.5 s = 26.0 s" in text


def test_metrics_without_the_steps_trained_again(tmp_path: Path) -> None:
    """The trainer may drop the records after the checkpoint on resume: the hang event says how far it got."""
    run_dir = preempted_run(tmp_path)
    rows = run_dir.metrics.read_text().splitlines(keepends=True)
    run_dir.metrics.write_text("".join(rows[:5] + rows[8:]))
    run_dir.events.write_text(
        run_dir.events.read_text().replace('"kind": "signal", "signal": "SIGUSR2"', '"kind": "hang", "step": 9')
    )
    report = build_report(load_records(run_dir))
    assert report is not None
    assert report.productive_s == pytest.approx(10.0)
    (restart,) = report.restarts
    assert (restart.cause, restart.lost_steps) == ("hang", 3)
    assert restart.lost_s == pytest.approx(26.0)


def test_a_run_without_restarts_or_start_events(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path / "r")
    run_dir.path.mkdir()
    run_dir.metrics.write_text(
        "".join(json.dumps({"step": k, "step_time_s": 2.0, "time": 100.0 + 2 * k}) + "\n" for k in range(1, 4))
    )
    report = build_report(load_records(run_dir))
    assert report is not None
    assert (report.wall_s, report.productive_s, report.goodput, report.restarts) == (6.0, 6.0, 1.0, ())
    assert report.total_steps is None


def test_nothing_to_report_before_the_first_start(tmp_path: Path) -> None:
    assert build_report(load_records(RunDir(tmp_path))) is None


def test_hang_restart_is_attributed_to_the_hang(tmp_path: Path) -> None:
    run_dir = preempted_run(tmp_path)
    text = run_dir.events.read_text().replace('"kind": "signal"', '"kind": "hang"')
    run_dir.events.write_text(text)
    report = build_report(load_records(run_dir))
    assert report is not None and report.restarts[0].cause == "hang"


def test_progress_bar_numbers(tmp_path: Path) -> None:
    progress = run_progress(load_records(preempted_run(tmp_path)), now_s=1040.5)
    assert progress is not None
    assert (progress.step, progress.total_steps, progress.restarts, progress.last_checkpoint_step) == (10, 20, 1, 10)
    assert progress.eta_s == pytest.approx(10.0)
    assert progress.last_checkpoint_age_s == pytest.approx(2.0)
    assert progress.tokens_per_s == pytest.approx(1007.0)  # median of the last 10 records
    assert progress.describe() == (
        "step 10/20, loss 4.0000, 1,007 tokens/s, ETA 0:10, restarts 1, last checkpoint step 10, 0:02 ago"
    )
    console = Console(width=120, record=True, color_system=None)
    console.print(progress_view(progress))
    shown = console.export_text()
    assert " 50%" in shown and "step 10/20" in shown and "━" in shown
    assert run_progress(load_records(RunDir(tmp_path / "none")), 0.0) is None


def test_format_duration() -> None:
    assert [format_duration(s) for s in (0, 59.6, 61, 3725, -3)] == ["0:00", "1:00", "1:01", "1:02:05", "0:00"]


def test_report_and_plot_commands(tmp_path: Path) -> None:
    run_dir = preempted_run(tmp_path)
    runner = CliRunner()
    result = runner.invoke(cli, ["report", str(run_dir.path), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["goodput"] == pytest.approx(10.0 / 38.5)
    assert data["restarts"][0]["lost_s"] == pytest.approx(26.0)
    assert data["progress"]["step"] == 10
    result = runner.invoke(cli, ["report", str(run_dir.path)])
    assert result.exit_code == 0 and "goodput      26.0%" in result.output
    png = tmp_path / "out" / "run.png"
    result = runner.invoke(cli, ["plot", str(run_dir.path), "-o", str(png)])
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


def test_plot_wants_a_png_and_a_started_run(tmp_path: Path) -> None:
    from air_hpc.errors import UserError

    run_dir = preempted_run(tmp_path)
    runner = CliRunner()
    result = runner.invoke(cli, ["plot", str(run_dir.path), "-o", str(tmp_path / "x.jpg")])
    assert isinstance(result.exception, UserError) and "expected a .png file name" in str(result.exception)
    empty = RunDir(tmp_path / "empty")
    empty.write_job(load_job(REPO / "configs" / "jobs" / "gpt-tiny-local.yaml"))
    result = runner.invoke(cli, ["report", str(empty.path)])
    assert isinstance(result.exception, UserError) and "has not started yet" in str(result.exception)


def test_status_shows_the_progress_bar_and_its_numbers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from air_hpc.records.submissions import record_submission
    from air_hpc.slurm.fake import FakeSlurm

    run_dir = preempted_run(tmp_path)
    fake = FakeSlurm()
    job_id = fake.sbatch(run_dir.job_json)
    record_submission(run_dir, job_id, "slurm")
    fake.start(job_id, "n[1-2]")
    cli.main(args=["status", str(run_dir.path), "--json"], standalone_mode=False, obj={"slurm_client": fake})
    shown = json.loads(capsys.readouterr().out)["progress"]
    assert (shown["step"], shown["total_steps"], shown["restarts"], shown["last_checkpoint_step"]) == (10, 20, 1, 10)
    cli.main(args=["status", str(run_dir.path)], standalone_mode=False, obj={"slurm_client": fake})
    text = capsys.readouterr().out
    assert "RUNNING" in text and " 50%" in text and "━" in text and "ETA 0:10, restarts 1" in text


def crashed_run(root: Path) -> RunDir:
    """The preempted run, but its first start ended in a rank's exception (two ranks recorded it)."""
    run_dir = preempted_run(root)
    crash = (
        '{"time": 1010.5, "kind": "rank_failed", "rank": 1, "node": "n2", "generation": "7-0", '
        '"error": "CheckpointingException: Global shape mismatch for loaded (torch.Size([64, 64]))"}\n'
        '{"time": 1010.7, "kind": "rank_failed", "rank": 0, "node": "n1", "generation": "7-0", '
        '"error": "RuntimeError: Connection closed by peer"}\n'
    )
    lines = run_dir.events.read_text().splitlines(keepends=True)
    run_dir.events.write_text(
        "".join(line for line in lines if '"signal"' not in line).replace(
            '\n{"time": 1030', "\n" + crash + '{"time": 1030', 1
        )
    )
    return run_dir


def test_a_crashed_start_is_named_by_its_exception_not_unknown(tmp_path: Path) -> None:
    report = build_report(load_records(crashed_run(tmp_path)))
    assert report is not None
    (restart,) = report.restarts
    assert restart.cause == "crashed" and restart.interrupted_s == 1010.5
    assert (
        restart.error == "rank 1 on n2: CheckpointingException: Global shape mismatch for loaded (torch.Size([64, 64]))"
    )
    assert "#1 crashed" in format_report(report) and "rank 1 on n2: CheckpointingException" in format_report(report)


def test_status_names_the_last_crash(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from air_hpc.records.submissions import record_submission
    from air_hpc.slurm.fake import FakeSlurm

    run_dir = crashed_run(tmp_path)
    fake = FakeSlurm()
    job_id = fake.sbatch(run_dir.job_json)
    record_submission(run_dir, job_id, "slurm")
    fake.start(job_id, "n[1-2]")
    cli.main(args=["status", str(run_dir.path), "--json"], standalone_mode=False, obj={"slurm_client": fake})
    assert json.loads(capsys.readouterr().out)["last_crash"].startswith("rank 1 on n2: CheckpointingException: Global")
    cli.main(args=["status", str(run_dir.path)], standalone_mode=False, obj={"slurm_client": fake})
    assert "crash    rank 1 on n2: CheckpointingException: Global shape mismatch" in capsys.readouterr().out
