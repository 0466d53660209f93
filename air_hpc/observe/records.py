"""A run's history as typed values, read from metrics.jsonl, events.jsonl and submissions.jsonl.

``progress``, ``report`` and ``plot`` all start here, so the files are parsed
in one place and torn or foreign lines are skipped the same way everywhere.
"""

import logging
from dataclasses import dataclass
from typing import Any

from air_hpc.records.events import EventKind
from air_hpc.records.jsonl import read_jsonl
from air_hpc.records.metrics import read_metrics
from air_hpc.records.rundir import RunDir

log = logging.getLogger(__name__)

#: Event kinds that mean "this start was stopped to be resumed later" (a signal, Slurm's preemption, the
#: ranks' agreed stop, which the deadline also makes).
PREEMPT_KINDS = frozenset({EventKind.SIGNAL, EventKind.PREEMPTED, EventKind.STOP})
#: Event kinds that end a start because a node failed.
FAULT_KINDS = frozenset({EventKind.HANG, EventKind.UNHEALTHY})


@dataclass(frozen=True)
class StepRecord:
    step: int
    time_s: float | None
    """When the step finished (wall clock); None in files written before steps carried a time."""
    step_time_s: float | None
    loss: float | None
    tokens_per_s: float | None


@dataclass(frozen=True)
class Event:
    time_s: float
    kind: str
    fields: dict[str, Any]

    def number(self, key: str) -> float | None:
        value = self.fields.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class RunRecords:
    steps: tuple[StepRecord, ...]
    events: tuple[Event, ...]
    starts_s: tuple[float, ...]
    """Wall-clock time of each start of the job (first start and every restart), ascending."""
    total_steps: int | None
    tokens_per_step: int | None
    submitted_s: float | None = None
    """When the run was first submitted (its queue wait starts here); None when not recorded."""
    gpus: int = 0
    """GPUs the run holds while it runs (nodes x the hardware's gpus_per_node; 0 on CPU hardware)."""
    usd_per_gpu_hour: float | None = None
    """The hardware profile's price, for the report's cost lines."""

    def of_kind(self, *kinds: str) -> tuple[Event, ...]:
        return tuple(e for e in self.events if e.kind in kinds)

    @property
    def straggler_nodes(self) -> tuple[str, ...]:
        """Nodes reported as stragglers at any time in the run, each once, in the order first reported."""
        nodes = [
            str(e.fields["node"]) for e in self.of_kind(EventKind.STRAGGLER) if isinstance(e.fields.get("node"), str)
        ]
        return tuple(dict.fromkeys(nodes))


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def parse_steps(rows: list[dict[str, Any]]) -> tuple[StepRecord, ...]:
    steps = []
    for row in rows:
        step = row.get("step")
        if not isinstance(step, int):
            continue
        steps.append(
            StepRecord(
                step,
                _float(row.get("time")),
                _float(row.get("step_time_s")),
                _float(row.get("loss")),
                _float(row.get("tokens_per_s")),
            )
        )
    return tuple(steps)


def parse_events(rows: list[dict[str, Any]]) -> tuple[Event, ...]:
    events = []
    for row in rows:
        when, kind = _float(row.get("time")), row.get("kind")
        if when is None or not isinstance(kind, str):
            continue
        events.append(Event(when, kind, {k: v for k, v in row.items() if k not in ("time", "kind")}))
    return tuple(sorted(events, key=lambda e: e.time_s))


def start_times(events: tuple[Event, ...], submissions: list[dict[str, Any]]) -> tuple[float, ...]:
    """Starts from the batch script's ``started`` lines (they include start-up); else the ranks' ``start`` events.

    Only our batch script writes ``started``; under submitit and the local
    executor the ranks' events are all there is.
    """
    starts = [t for row in submissions if row.get("kind") == "started" and (t := _float(row.get("time")))]
    if not starts:
        starts = [e.time_s for e in events if e.kind == EventKind.START]
    return tuple(sorted(starts))


def first_submission(submissions: list[dict[str, Any]]) -> float | None:
    times = [t for row in submissions if row.get("kind") == "submitted" and (t := _float(row.get("time")))]
    return min(times) if times else None


def load_records(run_dir: RunDir) -> RunRecords:
    events = parse_events(read_jsonl(run_dir.events))
    submissions = read_jsonl(run_dir.submissions)
    total = tokens = price = None
    gpus = 0
    if run_dir.job_json.is_file():
        job = run_dir.read_job()
        total, tokens = job.train.steps, job.train.global_batch_size * job.model.seq_len
        gpus = job.resources.nodes * job.hardware.gpus_per_node if job.hardware.device == "cuda" else 0
        price = job.hardware.usd_per_gpu_hour
    return RunRecords(
        steps=parse_steps(read_metrics(run_dir.metrics)),
        events=events,
        starts_s=start_times(events, submissions),
        total_steps=total,
        tokens_per_step=tokens,
        submitted_s=first_submission(submissions),
        gpus=gpus,
        usd_per_gpu_hour=price,
    )


def stop_reason(records: RunRecords) -> str | None:
    """Why the run stopped itself instead of requeueing (its last ``crash_loop`` event), or None."""
    stops = records.of_kind(EventKind.CRASH_LOOP)
    why = stops[-1].fields.get("why") if stops else None
    return f"crash loop: {why}" if isinstance(why, str) else None


def crash_text(event: Event) -> str:
    """``rank 0 on n1: CheckpointingException: Global shape mismatch ...`` of a ``rank_failed`` event."""
    where = f"rank {event.fields.get('rank', '?')}" + (
        f" on {event.fields['node']}" if event.fields.get("node") else ""
    )
    return f"{where}: {event.fields.get('error') or 'an exception'}"


def last_crash(records: RunRecords) -> str | None:
    """What the run's last crashed start raised (its first ``rank_failed`` event), or None."""
    crashes = records.of_kind(EventKind.RANK_FAILED)
    if not crashes:
        return None
    start = max((s for s in records.starts_s if s <= crashes[-1].time_s), default=None)
    first = next(e for e in crashes if start is None or e.time_s >= start)
    return crash_text(first)


def longest_sync_save_s(events: tuple[Event, ...]) -> float | None:
    """The longest synchronous save (what a preemption's save costs), or None before one was measured."""
    seconds = [
        s
        for e in events
        if e.kind == EventKind.CHECKPOINT_SAVED and e.fields.get("async") is False and (s := e.number("seconds"))
    ]
    return max(seconds, default=None)
