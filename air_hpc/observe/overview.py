"""One line per run for ``air-hpc runs``: state, progress, loss, restarts, goodput, checkpoint age, job id.

Built from the run's files plus the job state the caller looked up, so the
table renders (and is tested) without Slurm.
"""

from dataclasses import asdict, dataclass

from rich.table import Table

from air_hpc.observe.progress import format_duration, run_progress
from air_hpc.observe.records import load_records
from air_hpc.observe.report import build_report
from air_hpc.records.rundir import RunDir


@dataclass(frozen=True)
class RunRow:
    name: str
    path: str
    state: str
    job_id: str | None
    step: int | None
    total_steps: int | None
    loss: float | None
    restarts: int
    goodput: float | None
    last_checkpoint_age_s: float | None

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def run_row(run_dir: RunDir, state: str, job_id: str | None, restarts: int | None, now_s: float) -> RunRow:
    """The row of one run; restarts: the larger of the job status's count and the starts the run recorded."""
    records = load_records(run_dir)
    progress = run_progress(records, now_s)
    report = build_report(records)
    return RunRow(
        name=run_dir.path.name,
        path=str(run_dir.path),
        state=state,
        job_id=job_id,
        step=progress.step if progress else None,
        total_steps=records.total_steps,
        loss=progress.loss if progress else None,
        restarts=max(restarts or 0, progress.restarts if progress else 0),
        goodput=report.goodput if report else None,
        last_checkpoint_age_s=progress.last_checkpoint_age_s if progress else None,
    )


def runs_table(rows: list[RunRow]) -> Table:
    table = Table(box=None, pad_edge=False)
    for column in ("run", "state", "step", "loss", "restarts", "goodput", "last ckpt", "job"):
        numeric = column in ("step", "loss", "restarts", "goodput")
        table.add_column(column, justify="right" if numeric else "left", no_wrap=True)
    for row in rows:
        step = "-" if row.step is None else f"{row.step}" + (f"/{row.total_steps}" if row.total_steps else "")
        table.add_row(
            row.name,
            row.state,
            step,
            "-" if row.loss is None else f"{row.loss:.4f}",
            str(row.restarts),
            "-" if row.goodput is None else f"{100 * row.goodput:.1f}%",
            "-" if row.last_checkpoint_age_s is None else f"{format_duration(row.last_checkpoint_age_s)} ago",
            row.job_id or "-",
        )
    return table
