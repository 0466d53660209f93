"""The run records of our jobs, joined to sacct's rows by job id: what only the run itself knows.

sacct knows when a job held its nodes; the run's own records (``air_hpc.records``)
know what it did with them: productive step time, start-up, checkpoint stalls,
work lost and redone after a restart, MFU, and why each start ended (a hang, a
crash, a preemption). A run directory is found by the job ids its
``submissions.jsonl`` names; one whose files cannot be read is counted and left
out, never fatal.
"""

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from air_hpc.errors import AirHpcError
from air_hpc.observe.records import Event, load_records
from air_hpc.observe.report import build_report
from air_hpc.ops.runs import find_runs
from air_hpc.records.events import EventKind
from air_hpc.records.metrics import read_metrics
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import submissions

log = logging.getLogger(__name__)

#: Events that type a start's failure (the run knows a hang from a crash; sacct sees REQUEUED or FAILED for both).
EVENT_FAILURE: Mapping[str, str] = {
    EventKind.HANG: "infrastructure",
    EventKind.UNHEALTHY: "infrastructure",
    EventKind.NODE_DEAD: "infrastructure",
    EventKind.SPARES_EXHAUSTED: "infrastructure",
    EventKind.RANK_FAILED: "application",
    EventKind.CRASH_LOOP: "application",
}


@dataclass(frozen=True)
class RunFacts:
    """One run's own account of its time (its whole history: the report shares it out over windows)."""

    name: str
    path: Path
    productive_s: float
    startup_s: float
    restart_latency_s: float
    checkpoint_stall_s: float
    lost_work_s: float
    mfu: float | None
    """Step-time-weighted mean MFU of the steps that recorded one (GPUs with a known peak); None elsewhere."""
    preempted_at_s: tuple[float, ...]
    """When each ``preempted`` event was written."""
    failed_at_s: tuple[tuple[float, str], ...]
    """(time, kind) of each event that types a failure."""


@dataclass(frozen=True)
class RunIndex:
    """Run directories by the job ids that carried them."""

    by_job: Mapping[str, RunDir]
    runs: int
    """Run directories looked at."""


def index_runs(roots: Iterable[Path]) -> RunIndex:
    """Every run directory directly under each root, by the Slurm job ids its submissions name."""
    by_job: dict[str, RunDir] = {}
    runs = 0
    for root in roots:
        for run_dir in find_runs(root):
            runs += 1
            try:
                for record in submissions(run_dir):
                    if record.executor != "local":
                        by_job.setdefault(record.job_id, run_dir)
            except (AirHpcError, OSError) as exc:
                log.warning("%s: submissions unreadable, its jobs count as not ours: %s", run_dir.path, exc)
    return RunIndex(by_job, runs)


def _mfu(rows: Iterable[Mapping[str, object]]) -> float | None:
    weighted = seconds = 0.0
    for row in rows:
        mfu, step_s = row.get("mfu"), row.get("step_time_s")
        if isinstance(mfu, (int, float)) and isinstance(step_s, (int, float)) and step_s > 0:
            weighted += float(mfu) * float(step_s)
            seconds += float(step_s)
    return weighted / seconds if seconds > 0 else None


def _failures(events: Iterable[Event]) -> tuple[tuple[float, str], ...]:
    found = []
    for event in events:
        kind = EVENT_FAILURE.get(event.kind)
        if kind is None and event.kind == EventKind.REQUEUE and event.fields.get("reason") == "crashed":
            kind = "application"  # a rank killed without a word (SIGKILL): the batch script saw the crash
        if kind is not None:
            found.append((event.time_s, kind))
    return tuple(found)


def run_facts(run_dir: RunDir) -> RunFacts | None:
    """The run's facts from its records; None when they cannot be read (said once in the log)."""
    try:
        records = load_records(run_dir)
    except (AirHpcError, OSError) as exc:
        log.warning("%s: run records unreadable, left out of the fleet report: %s", run_dir.path, exc)
        return None
    report = build_report(records)
    parts = report.breakdown if report is not None else None
    return RunFacts(
        name=run_dir.path.name,
        path=run_dir.path,
        productive_s=parts.productive_s if parts else 0.0,
        startup_s=parts.startup_s if parts else 0.0,
        restart_latency_s=parts.restart_latency_s if parts else 0.0,
        checkpoint_stall_s=parts.checkpoint_stall_s if parts else 0.0,
        lost_work_s=parts.lost_work_s if parts else 0.0,
        mfu=_mfu(read_metrics(run_dir.metrics)),
        preempted_at_s=tuple(e.time_s for e in records.of_kind(EventKind.PREEMPTED)),
        failed_at_s=_failures(records.events),
    )
