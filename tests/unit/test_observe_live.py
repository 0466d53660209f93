"""The live view: the panel at a fixed width, plain lines off a terminal, and ``status --watch``."""

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from air_hpc.cli.main import cli
from air_hpc.observe.live import LiveView, live_panel, plain_line
from air_hpc.observe.progress import RunProgress
from air_hpc.ops.control import RunStatus, live_view, run_status, watch_run
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import record_submission
from air_hpc.slurm.fake import FakeSlurm
from air_hpc.slurm.jobs import JobState, JobStatus
from tests.unit.test_observe_report import preempted_run

VIEW = LiveView(
    run="gpt-tiny-local",
    job_id="100",
    state="RUNNING",
    restarts=1,
    progress=RunProgress(12, 20, 3.875, 1234.0, 8.0, 1, 10, 2.0),
    last_event="checkpoint_saved (step 10), 0:02 ago",
)


def test_the_panel_shows_every_number() -> None:
    console = Console(width=80, record=True, color_system=None)
    console.print(live_panel(VIEW, bar_width=20))
    text = console.export_text()
    for expected in (
        "gpt-tiny-local",
        "job 100",
        "state       RUNNING",
        "step 12/20 (60%)",
        "loss        3.8750",
        "tokens/s    1,234",
        "ETA         0:08",
        "restarts    1",
        "last event  checkpoint_saved (step 10), 0:02 ago",
    ):
        assert expected in text, text
    assert "━" in text


def test_the_plain_line() -> None:
    assert plain_line(VIEW) == (
        "gpt-tiny-local job 100: RUNNING, step 12/20 (60%), loss 3.8750, 1,234 tokens/s, ETA 0:08, restarts 1, "
        "last: checkpoint_saved (step 10), 0:02 ago"
    )


def fake_run(tmp_path: Path) -> tuple[RunDir, FakeSlurm, str]:
    run_dir = preempted_run(tmp_path)
    fake = FakeSlurm()
    job_id = fake.sbatch(run_dir.job_json)
    record_submission(run_dir, job_id, "slurm")
    return run_dir, fake, job_id


def scripted(run_dir: RunDir, fake: FakeSlurm, job_id: str) -> Iterator[RunStatus]:
    """Pending, then running (twice, unchanged), then done: the poll sequence of a short job."""
    yield run_status(run_dir, fake)
    fake.start(job_id, "n[1-2]")
    yield run_status(run_dir, fake)
    yield run_status(run_dir, fake)
    fake.finish(job_id)
    yield run_status(run_dir, fake)


def test_off_a_terminal_one_plain_line_per_change(tmp_path: Path) -> None:
    run_dir, fake, job_id = fake_run(tmp_path)
    out = io.StringIO()
    polls = scripted(run_dir, fake, job_id)
    final = watch_run(lambda: next(polls), Console(file=out, width=300), timeout_s=60, poll_s=0)
    assert final.job.state is JobState.COMPLETED
    lines = out.getvalue().splitlines()
    assert [line.split(",")[0] for line in lines] == [
        f"gpt-tiny-local job {job_id}: PENDING (Priority: waiting for jobs of higher priority to start first)",
        f"gpt-tiny-local job {job_id}: RUNNING",
        f"gpt-tiny-local job {job_id}: COMPLETED",
    ]
    assert "step 10/20 (50%), loss 4.0000" in lines[-1] and "restarts 1, last: checkpoint_saved (step 10)" in lines[-1]


def test_on_a_terminal_the_panel(tmp_path: Path) -> None:
    run_dir, fake, job_id = fake_run(tmp_path)
    out = io.StringIO()
    polls = scripted(run_dir, fake, job_id)
    console = Console(file=out, width=100, force_terminal=True, color_system=None)
    watch_run(lambda: next(polls), console, timeout_s=60, poll_s=0)
    text = out.getvalue()
    assert "COMPLETED" in text and "last event" in text and f"job {job_id}" in text


def test_live_view_counts_the_restarts_the_run_recorded(tmp_path: Path) -> None:
    run_dir, fake, _job_id = fake_run(tmp_path)
    view = live_view(run_status(run_dir, fake), now_s=1040.5)
    assert (view.restarts, view.last_event) == (1, "checkpoint_saved (step 10), 0:02 ago")


def test_status_watch_by_name_until_the_job_ends(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _run_dir, fake, job_id = fake_run(tmp_path)
    fake.start(job_id, "n[1-2]")
    fake.finish(job_id)
    monkeypatch.setenv("AIR_HPC_RUNS_ROOT", str(tmp_path))
    cli.main(args=["status", "gpt-tiny-local", "--watch"], standalone_mode=False, obj={"slurm_client": fake})
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"gpt-tiny-local job {job_id}: COMPLETED, step 10/20 (50%)")
    with pytest.raises(Exception, match="--watch follows one run"):
        cli.main(args=["status", "--watch"], standalone_mode=False, obj={"slurm_client": fake})


class FinishingSlurm(FakeSlurm):
    """Runs each job on the second look at it and completes it on the third."""

    def job_status(self, job_id: str) -> JobStatus | None:
        job = self.jobs[job_id]
        if job.state is JobState.RUNNING:
            self.finish(job_id)
        elif job.state is JobState.PENDING:
            self.start(job_id, "n[1-2]")
        return super().job_status(job_id)


def test_submit_wait_follows_in_plain_lines_then_summarizes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, small_corpus: Path
) -> None:
    import air_hpc.ops.control as control

    monkeypatch.setattr(control.time, "sleep", lambda _s: None)
    from tests.unit.test_observe_report import REPO

    job = str(REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml")
    args = ["submit", job, "--set", f"run.root={tmp_path}", "--set", f"data.path={small_corpus}", "--wait"]
    cli.main(args=args, standalone_mode=False, obj={"slurm_client": FinishingSlurm()})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("submitted job 100 (slurm)")
    assert [line.split(",")[0] for line in lines[1:3]] == [
        "gpt-tiny-testbed job 100: RUNNING",
        "gpt-tiny-testbed job 100: COMPLETED",
    ]
    assert "job      100 (slurm): COMPLETED" in lines
