"""The run's event log (events.jsonl): the one owner of every event kind, its payload, and how it is written.

Events are what a person reads after a preemption ("signal at 12:03, checkpoint
step 40 in 1.2 s, requeued, resumed from 40"), so each line is flushed and
fsynced: a crash right after ``emit`` must not lose it. The batch script's
lines (signal, requeue, preempted) follow the same schema (``records.jsonl``).

Every kind is an :class:`EventKind` and has one frozen payload class whose
fields are the line's fields, in order; a writer emits a payload, never a bare
string, and a reader compares against :class:`EventKind` members, so a kind that
nothing writes, or that a reader waits for in vain, cannot drift in
(``tests/unit/test_event_kinds.py``). The kind strings on disk are the members' values.
"""

import dataclasses
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar

from air_hpc.records.jsonl import append, read_jsonl, record

log = logging.getLogger(__name__)


class EventKind(StrEnum):
    """Every kind of line in events.jsonl, with the module that writes it."""

    START = "start"  # health.guard: rank 0 begins a start (a generation)
    STARTUP = "startup"  # train.trainer: every rank's start-up phases, once per start
    STOP = "stop"  # train.trainer: the ranks agreed to stop (a signal or the deadline)
    SIGNAL = "signal"  # the batch shell (runtime.batch event): a stop signal reached it
    PREEMPTED = "preempted"  # runtime.batch: Slurm preempted the job
    REQUEUE = "requeue"  # runtime.batch: the batch shell requeues the job
    CHECKPOINT_SAVED = "checkpoint_saved"  # resilience.checkpointer
    CHECKPOINT_FAILED = "checkpoint_failed"  # resilience.checkpointer
    CHECKPOINT_SKIPPED = "checkpoint_skipped"  # resilience.checkpointer: superseded, or failed verification
    CHECKPOINT_PARTIAL = "checkpoint_partial"  # resilience.checkpointer: a save that never finished, ignored
    CHECKPOINT_INTERVAL = "checkpoint_interval"  # train.trainer: ``interval_steps: auto`` chose (resilience.interval)
    FRESH_START = "fresh_start"  # resilience.checkpointer: no checkpoint verified; allow_fresh_start
    RESUME = "resume"  # resilience.checkpointer: loaded a checkpoint
    SNAPSHOT_BUDDIES = "snapshot_buddies"  # resilience.memory: where each rank's in-memory snapshot copy goes
    SNAPSHOT_SKIPPED = "snapshot_skipped"  # resilience.memory: a held snapshot failed its checks; not loaded
    MEMORY_RESUME = "memory_resume"  # resilience.memory: resumed from in-memory snapshots
    CRASH_LOOP = "crash_loop"  # runtime.entry: restarts in a row saved nothing; the run stops itself
    RANK_FAILED = "rank_failed"  # runtime.entry: a rank's start ended in an exception, named here
    HANG = "hang"  # health.watchdog
    UNHEALTHY = "unhealthy"  # health.preflight
    STRAGGLER = "straggler"  # train.straggler_watch
    NODE_DEAD = "node_dead"  # runtime.supervisor: a node stopped answering during a step
    SPARES_EXHAUSTED = "spares_exhausted"  # runtime.supervisor
    IN_JOB_RESTART = "in_job_restart"  # runtime.supervisor: the step restarts on spare nodes
    STEP_STARTED = "step_started"  # runtime.supervisor
    STEP_ENDED = "step_ended"  # runtime.supervisor
    ROUTE = "route"  # launch.submit: ``submit --clusters`` chose the cluster (launch.route), and why


@dataclass(frozen=True)
class Payload:
    """The fields of one kind's line; a subclass names its kind in ``KIND``."""

    KIND: ClassVar[EventKind]

    def fields(self) -> dict[str, Any]:
        """The line's fields in declaration order; a trailing ``_`` (``async_``) is dropped from the key."""
        return {f.name.removesuffix("_"): getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True)
class Start(Payload):
    KIND = EventKind.START
    generation: str
    world_size: int
    host: str


@dataclass(frozen=True)
class Startup(Payload):
    KIND = EventKind.STARTUP
    step: int
    ranks: int
    to_first_step_s: float
    slowest_rank: int
    cpu_to_first_step_s: list[float]
    phases_s: dict[str, list[float]]
    cpu_phases_s: dict[str, list[float]]
    median_s: dict[str, float]


@dataclass(frozen=True)
class Stop(Payload):
    KIND = EventKind.STOP
    step: int
    reason: str
    signal: str | None


@dataclass(frozen=True)
class Signal(Payload):
    KIND = EventKind.SIGNAL
    signal: str


@dataclass(frozen=True)
class Preempted(Payload):
    KIND = EventKind.PREEMPTED
    grace_s: int
    ended_after_s: int
    fit: bool
    requeue_by: str


@dataclass(frozen=True)
class Requeue(Payload):
    KIND = EventKind.REQUEUE
    exit_code: int
    reason: str


@dataclass(frozen=True)
class CheckpointSaved(Payload):
    KIND = EventKind.CHECKPOINT_SAVED
    step: int
    bytes: int
    seconds: float
    stall_s: float
    path: str
    reason: str
    phases: dict[str, float]
    async_: bool


@dataclass(frozen=True)
class CheckpointFailed(Payload):
    KIND = EventKind.CHECKPOINT_FAILED
    step: int
    why: str


@dataclass(frozen=True)
class CheckpointSkipped(Payload):
    KIND = EventKind.CHECKPOINT_SKIPPED
    step: int
    why: str


@dataclass(frozen=True)
class CheckpointPartial(Payload):
    KIND = EventKind.CHECKPOINT_PARTIAL
    path: str
    why: str


@dataclass(frozen=True)
class CheckpointInterval(Payload):
    KIND = EventKind.CHECKPOINT_INTERVAL
    step: int
    steps: int
    interval_s: float
    save_cost_s: float
    step_time_s: float
    mtbf_h: float
    expected_waste: float


@dataclass(frozen=True)
class FreshStart(Payload):
    KIND = EventKind.FRESH_START
    skipped: int


@dataclass(frozen=True)
class Resume(Payload):
    KIND = EventKind.RESUME
    step: int
    seconds: float
    layout_changed: bool
    rng_restored: bool
    saved_layout: str


@dataclass(frozen=True)
class SnapshotBuddies(Payload):
    KIND = EventKind.SNAPSHOT_BUDDIES
    buddies: dict[str, int]
    """Rank -> the rank on another node that keeps its copy (ranks without one are absent)."""
    refused: str | None


@dataclass(frozen=True)
class SnapshotSkipped(Payload):
    KIND = EventKind.SNAPSHOT_SKIPPED
    step: int
    owner: int
    node: str
    why: str


@dataclass(frozen=True)
class MemoryResume(Payload):
    KIND = EventKind.MEMORY_RESUME
    step: int
    seconds: float
    sources: dict[str, str]
    """Owner rank -> the node whose holder gave its snapshot."""
    newest_checkpoint: int | None


@dataclass(frozen=True)
class CrashLoop(Payload):
    KIND = EventKind.CRASH_LOOP
    generation: str
    why: str


@dataclass(frozen=True)
class RankFailed(Payload):
    KIND = EventKind.RANK_FAILED
    rank: int
    node: str
    generation: str
    error: str
    """The exception's type and first line."""


@dataclass(frozen=True)
class Hang(Payload):
    KIND = EventKind.HANG
    step: int
    phase: str
    silent_s: float
    detected_by: int
    suspect_ranks: list[int]
    suspect_nodes: list[str]
    why: str
    limit_s: float | None = None
    """The limit that fired (``health.limits``)."""
    limit: str = ""
    """Which limit fired and how it was derived: configured, or learned from the run's phase times."""


@dataclass(frozen=True)
class Unhealthy(Payload):
    KIND = EventKind.UNHEALTHY
    node: str
    rank: int
    failed: dict[str, str]


@dataclass(frozen=True)
class Straggler(Payload):
    KIND = EventKind.STRAGGLER
    step: int
    node: str
    ranks: list[int]
    busy_s: float
    reference_s: float
    ratio: float
    noise_s: float
    window_steps: int
    windows: int
    excluded: bool


@dataclass(frozen=True)
class NodeDead(Payload):
    KIND = EventKind.NODE_DEAD
    nodes: list[str]


@dataclass(frozen=True)
class SparesExhausted(Payload):
    KIND = EventKind.SPARES_EXHAUSTED
    failed: list[str]
    spares: list[str]
    exit_code: int


@dataclass(frozen=True)
class InJobRestart(Payload):
    KIND = EventKind.IN_JOB_RESTART
    attempt: int
    replaced: dict[str, str]
    reason: str
    spares_left: list[str]


@dataclass(frozen=True)
class StepStarted(Payload):
    KIND = EventKind.STEP_STARTED
    attempt: int
    generation: str
    nodes: str
    spares: list[str]
    warm: bool = False
    """Its ranks are promoted warm standbys (``runtime.standby``), not a new ``srun``."""


@dataclass(frozen=True)
class StepEnded(Payload):
    KIND = EventKind.STEP_ENDED
    attempt: int
    exit_code: int
    srun_exit_code: int
    verdict: int | None
    failure: dict[str, Any] | None
    dead_nodes: list[str]
    elapsed_s: float


@dataclass(frozen=True)
class Route(Payload):
    KIND = EventKind.ROUTE
    cluster: str
    job_id: str
    reason: str
    answers: list[dict[str, Any]]
    """Each cluster asked: its expected start, nodes and their quality, or why it was skipped."""


#: The kinds that say a start resumed (its ``step``): from a persistent checkpoint or from in-memory snapshots.
RESUME_KINDS = frozenset({EventKind.RESUME, EventKind.MEMORY_RESUME})


#: Each kind's payload class (one each: ``tests/unit/test_event_kinds.py``).
PAYLOADS: Mapping[EventKind, type[Payload]] = {
    p.KIND: p
    for p in (
        Start, Startup, Stop, Signal, Preempted, Requeue, CheckpointSaved, CheckpointFailed, CheckpointSkipped,
        CheckpointPartial, CheckpointInterval, FreshStart, Resume, CrashLoop, RankFailed, Hang, Unhealthy, Straggler,
        NodeDead, SparesExhausted, InJobRestart, StepStarted, StepEnded, SnapshotBuddies, SnapshotSkipped,
        MemoryResume, Route,
    )
}  # fmt: skip


def payload_from_text(kind: str, fields: Mapping[str, str]) -> Payload:
    """A payload from the batch shell's words (``event RUN signal --field signal=SIGUSR2``); ValueError if unfit."""
    try:
        return PAYLOADS[EventKind(kind)](**fields)
    except ValueError:
        raise ValueError(f"unknown event kind {kind!r}; expected one of {', '.join(EventKind)}") from None
    except TypeError as exc:
        raise ValueError(f"event {kind!r} takes the fields {_names(PAYLOADS[EventKind(kind)])}: {exc}") from None


def _names(payload: type[Payload]) -> str:
    return ", ".join(f.name for f in dataclasses.fields(payload))


class EventLog:
    """Appends events to ``path`` (normally ``RunDir(...).events``).

    ``context``: fields every event of this writer carries before its payload's
    (the batch shell and the supervisor: ``job_id``, ``restart_count``).
    """

    def __init__(self, path: Path, context: Mapping[str, object] | None = None) -> None:
        self.path = Path(path)
        self.context = dict(context or {})

    def emit(self, payload: Payload, at_s: float | None = None) -> dict[str, Any]:
        """Write ``{"time": at_s or now, "kind": ..., **context, **payload}`` as one line and fsync it.

        ``at_s``: a moment already passed (the batch shell's signal, noted on entry).
        """
        fields = {**self.context, **payload.fields()}
        event = record(payload.KIND.value, time.time() if at_s is None else at_s, **fields)
        append(self.path, event, durable=True)
        log.info("event %s %s", payload.KIND.value, fields)
        return event


def read_events(path: Path) -> list[dict[str, Any]]:
    """All events of a log; a torn last line (crash mid-write) is skipped with a warning."""
    return read_jsonl(path)
