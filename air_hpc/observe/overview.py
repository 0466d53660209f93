"""One line per run for ``air-hpc runs``: state, progress, loss, restarts, goodput, checkpoint age, job id.

Built from the run's files (:mod:`air_hpc.observe.summary`, shared with the
Prometheus exporter) plus the job state the caller looked up, so the table
renders (and is tested) without Slurm.
"""

from dataclasses import dataclass

from rich.table import Table

from air_hpc.observe.progress import format_duration
from air_hpc.observe.records import load_records
from air_hpc.observe.summary import RunSummary, blank_summary, summarize
from air_hpc.records.rundir import RunDir
from air_hpc.slurm.reasons import plain_reason, with_reason

#: The state shown for a run whose own files cannot be read.
UNREADABLE = "unreadable"


@dataclass(frozen=True)
class RunRow:
    summary: RunSummary
    state: str
    job_id: str | None
    problem: str | None = None
    """Why the run's records could not be read (its state is then ``unreadable``); None when they were."""
    reason: str = ""
    """Slurm's reason a pending job waits (``AssocGrpNodeLimit``), shown with its plain words."""

    def to_json(self) -> dict[str, object]:
        s = self.summary
        return {
            "name": s.name,
            "path": s.path,
            "state": self.state,
            "reason": self.reason,
            "reason_text": plain_reason(self.reason),
            "job_id": self.job_id,
            "step": s.step,
            "total_steps": s.total_steps,
            "loss": s.loss,
            "restarts": s.restarts,
            "goodput": s.goodput,
            "last_checkpoint_age_s": s.last_checkpoint_age_s,
            "problem": self.problem,
        }


def run_row(
    run_dir: RunDir, state: str, job_id: str | None, restarts: int | None, now_s: float, reason: str = ""
) -> RunRow:
    """The row of one run; restarts: the job status's count (None: not known); reason: why a pending job waits."""
    return RunRow(summarize(run_dir, load_records(run_dir), restarts, now_s), state, job_id, reason=reason)


def unreadable_row(run_dir: RunDir, job_id: str | None, problem: str) -> RunRow:
    """The row of a run whose files cannot be read (an empty ``job.json``): listed and marked, never hiding the rest."""
    return RunRow(blank_summary(run_dir), UNREADABLE, job_id, problem)


def runs_table(rows: list[RunRow]) -> Table:
    table = Table(box=None, pad_edge=False)
    for column in ("run", "state", "step", "loss", "restarts", "goodput", "last ckpt", "job"):
        numeric = column in ("step", "loss", "restarts", "goodput")
        table.add_column(column, justify="right" if numeric else "left", no_wrap=True)
    for row in rows:
        s = row.summary
        step = "-" if s.step is None else f"{s.step}" + (f"/{s.total_steps}" if s.total_steps else "")
        table.add_row(
            s.name,
            with_reason(row.state, row.reason),
            step,
            "-" if s.loss is None else f"{s.loss:.4f}",
            str(s.restarts),
            "-" if s.goodput is None else f"{100 * s.goodput:.1f}%",
            "-" if s.last_checkpoint_age_s is None else f"{format_duration(s.last_checkpoint_age_s)} ago",
            row.job_id or "-",
        )
    return table
