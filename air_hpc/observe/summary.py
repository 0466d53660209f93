"""The numbers of one run now, from its records: what ``air-hpc runs`` and the Prometheus exporter both show.

One builder, so the table and the metrics cannot disagree about a run's step,
loss, goodput, restarts or checkpoint age.
"""

from dataclasses import dataclass

from air_hpc.observe.progress import run_progress
from air_hpc.observe.records import RunRecords
from air_hpc.observe.report import build_report
from air_hpc.records.rundir import RunDir


@dataclass(frozen=True)
class RunSummary:
    """A run's progress now; a value the run does not have yet is None."""

    name: str
    path: str
    step: int | None
    total_steps: int | None
    loss: float | None
    tokens_per_s: float | None
    goodput: float | None
    restarts: int
    last_checkpoint_age_s: float | None


def blank_summary(run_dir: RunDir) -> RunSummary:
    """A run whose records cannot be read: its name and path, no numbers."""
    return RunSummary(run_dir.path.name, str(run_dir.path), None, None, None, None, None, 0, None)


def summarize(run_dir: RunDir, records: RunRecords, restarts: int | None, now_s: float) -> RunSummary:
    """``restarts``: the job status's count (None: unknown); the larger of it and the starts the run recorded wins."""
    progress = run_progress(records, now_s)
    report = build_report(records)
    return RunSummary(
        name=run_dir.path.name,
        path=str(run_dir.path),
        step=progress.step if progress else None,
        total_steps=records.total_steps,
        loss=progress.loss if progress else None,
        tokens_per_s=progress.tokens_per_s if progress else None,
        goodput=report.goodput if report else None,
        restarts=max(restarts or 0, progress.restarts if progress else 0),
        last_checkpoint_age_s=progress.last_checkpoint_age_s if progress else None,
    )
