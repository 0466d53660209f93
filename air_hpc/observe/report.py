"""Goodput and what each restart cost, from a run's records.

- wall time runs from the first submission (else the first start) to the last
  thing the run recorded, and is broken into parts that add up to it: queue
  wait, start-up (first start to its first step), productive training,
  checkpoint stall, lost work, restart latency, and the rest (between steps:
  logging, metrics, the final save's tail);
- goodput = productive training time / wall time, where
  productive time is the step time of every step that survived (a step
  trained again after a restart counts once, its lost first run not at all);
- each restart loses the time spent on steps after the checkpoint it resumed
  from (trained again later) plus its latency: from the interruption (the
  stop, hang or unhealthy event) to the start of the first step after it
  (the preemption save, the requeue wait, start-up and loading the checkpoint);
- checkpoint overhead is the time training waited for saves (``stall_s`` of
  ``checkpoint_saved`` events; an async save stalls only while it snapshots),
  except saves made after an interruption, which count in its latency;
- stragglers are the nodes the ranks found consistently slower per step than the
  others (``straggler`` events), and start-up the time each start took from its
  processes' creation to its first step (``startup`` events).
"""

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from air_hpc.observe.records import (
    FAULT_KINDS,
    PREEMPT_KINDS,
    Event,
    RunRecords,
    StepRecord,
    crash_text,
    stop_reason,
)
from air_hpc.records.events import RESUME_KINDS, EventKind


@dataclass(frozen=True)
class Restart:
    number: int
    """1 for the first restart."""
    cause: str
    """``preemption``, ``hang``, ``unhealthy``, ``crashed`` (a rank raised) or ``unknown``."""
    interrupted_s: float
    """When the start was stopped (its stop, hang or unhealthy event; else its last step or its start)."""
    resumed_s: float | None
    """Start of the first step after the restart; None while it has not trained yet."""
    lost_steps: int
    lost_compute_s: float
    latency_s: float | None
    error: str | None = None
    """A crash's rank and exception (``rank 0 on n1: ValueError: ...``)."""

    @property
    def lost_s(self) -> float:
        return self.lost_compute_s + (self.latency_s or 0.0)


@dataclass(frozen=True)
class TimeBreakdown:
    """Where the wall time went; the parts are disjoint spans of the timeline and sum to ``wall_s``."""

    queue_wait_s: float
    startup_s: float
    productive_s: float
    checkpoint_stall_s: float
    """Saves training waited for, except those inside lost work or a restart (counted there)."""
    lost_work_s: float
    restart_latency_s: float
    other_s: float

    @property
    def wall_s(self) -> float:
        return sum(asdict(self).values())


@dataclass(frozen=True)
class Cost:
    """GPU-hours the run held (allocated time x GPUs) and the part that produced nothing that counted."""

    gpus: int
    allocated_s: float
    gpu_hours_used: float
    gpu_hours_lost: float
    usd_per_gpu_hour: float | None

    @property
    def usd_used(self) -> float | None:
        return None if self.usd_per_gpu_hour is None else self.gpu_hours_used * self.usd_per_gpu_hour

    @property
    def usd_lost(self) -> float | None:
        return None if self.usd_per_gpu_hour is None else self.gpu_hours_lost * self.usd_per_gpu_hour


@dataclass(frozen=True)
class StragglerSeen:
    node: str
    step: int | None
    """The step at which it was first reported."""
    ratio: float | None
    """Its busy time per step over the other nodes' median."""
    excluded: bool
    """Put on the bad-node list (``health.exclude_stragglers``)."""


@dataclass(frozen=True)
class AutoInterval:
    """``checkpoint.interval_steps: auto``: the last choice, and the loss it expected against the loss measured."""

    steps: int
    save_cost_s: float
    mtbf_h: float
    expected_waste: float
    """Fraction of wall time the model expects lost to saves and redone work."""
    measured_waste: float | None
    """Training's wait for saves plus the work lost to restarts, over wall time."""


@dataclass(frozen=True)
class RunReport:
    first_start_s: float
    last_activity_s: float
    wall_s: float
    productive_s: float
    goodput: float | None
    steps_done: int
    total_steps: int | None
    restarts: tuple[Restart, ...]
    checkpoints: int
    checkpoint_stall_s: float
    checkpoint_write_s: float
    breakdown: TimeBreakdown
    cost: Cost
    submitted_s: float | None = None
    stragglers: tuple[StragglerSeen, ...] = ()
    starts_to_first_step_s: tuple[float, ...] = ()
    """Each start's process creation to first step (its slowest rank, ``startup`` events), in order."""
    stopped_because: str | None = None
    """Why the run stopped itself instead of requeueing (a crash loop)."""
    auto_interval: AutoInterval | None = None

    @property
    def lost_s(self) -> float:
        return sum(r.lost_s for r in self.restarts)

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["restarts"] = [{**asdict(r), "lost_s": r.lost_s} for r in self.restarts]
        data["lost_s"] = self.lost_s
        data["cost"] = {**asdict(self.cost), "usd_used": self.cost.usd_used, "usd_lost": self.cost.usd_lost}
        return data


def _began_s(step: StepRecord) -> float | None:
    return None if step.time_s is None else step.time_s - (step.step_time_s or 0.0)


def _interruption(records: RunRecords, since_s: float, until_s: float) -> tuple[str, float | None, int | None]:
    """(cause, time, last completed step) of what ended the start running from ``since_s`` to ``until_s``."""
    events = [e for e in records.events if since_s <= e.time_s < until_s]
    crash = next((e for e in events if e.kind == EventKind.RANK_FAILED), None)
    if crash is not None:  # the first rank that raised; the others usually failed because of it
        return "crashed", crash.time_s, None
    for event in reversed(events):
        step = event.number("step")
        if event.kind in FAULT_KINDS:
            # A hang is noticed inside the step it names; that step did not complete.
            return event.kind, event.time_s, int(step) - 1 if step is not None else None
        if event.kind in PREEMPT_KINDS:
            return "preemption", event.time_s, int(step) if step is not None else None
    return "unknown", None, None


def _resumed_from(records: RunRecords, since_s: float, until_s: float) -> int:
    """The step a start resumed from, a checkpoint's or an in-memory snapshot's (0: from scratch)."""
    steps = [e.number("step") for e in records.of_kind(*RESUME_KINDS) if since_s <= e.time_s < until_s]
    return int(steps[0]) if steps and steps[0] is not None else 0


def build_report(records: RunRecords) -> RunReport | None:
    """The report of a run that has trained or started at least once; None before that.

    Works whether the trainer kept the records of steps it trained again
    (then they are counted) or dropped them on resume (then the interruption's
    event says which step was reached, and time tells the rest).
    """
    timeline = _timeline(records)
    if timeline is None:
        return None
    starts, segments = timeline
    restarts = _restarts(records, starts, segments)
    timed = (s.time_s for s in records.steps if s.time_s is not None)
    last = max([*timed, *(e.time_s for e in records.events), starts[-1]])
    submitted = records.submitted_s if records.submitted_s is not None and records.submitted_s <= starts[0] else None
    origin = submitted if submitted is not None else starts[0]
    wall = last - origin
    saves = records.of_kind(EventKind.CHECKPOINT_SAVED)
    stalls = _stalls(saves, restarts, last)
    breakdown = _breakdown(records, starts, segments, restarts, stalls, origin, last)
    return RunReport(
        first_start_s=starts[0],
        last_activity_s=last,
        wall_s=wall,
        productive_s=breakdown.productive_s,
        goodput=breakdown.productive_s / wall if wall > 0 else None,
        steps_done=max((s.step for s in records.steps), default=0),
        total_steps=records.total_steps,
        restarts=tuple(restarts),
        checkpoints=len(saves),
        checkpoint_stall_s=sum(e.number("stall_s") or 0.0 for e in stalls),
        checkpoint_write_s=sum(e.number("seconds") or 0.0 for e in saves),
        breakdown=breakdown,
        cost=_cost(records, starts, last, breakdown),
        submitted_s=submitted,
        stragglers=stragglers_seen(records),
        starts_to_first_step_s=tuple(
            s for e in records.of_kind(EventKind.STARTUP) if (s := e.number("to_first_step_s")) is not None
        ),
        stopped_because=stop_reason(records),
        auto_interval=_auto_interval(records, breakdown.checkpoint_stall_s + breakdown.lost_work_s, wall),
    )


def _timeline(records: RunRecords) -> tuple[list[float], list[list[StepRecord]]] | None:
    """Each start's time, and the timed steps that began during it; None before anything started.

    Steps that began before the first recorded start (its record was lost) get a start of their own.
    """
    timed = [s for s in records.steps if s.time_s is not None]
    starts = list(records.starts_s)
    first_step_began = min((b for s in timed if (b := _began_s(s)) is not None), default=None)
    if not starts and first_step_began is None:
        return None
    if not starts or (first_step_began is not None and first_step_began < starts[0]):
        starts.insert(0, first_step_began if first_step_began is not None else starts[0])
    segments: list[list[StepRecord]] = [[] for _ in starts]
    for step in timed:
        began = _began_s(step)
        index = max(bisect.bisect_right(starts, began if began is not None else 0.0) - 1, 0)
        segments[index].append(step)
    return starts, segments


def _restarts(records: RunRecords, starts: list[float], segments: list[list[StepRecord]]) -> list[Restart]:
    """One :class:`Restart` per start after the first: what stopped the one before, and what it cost."""
    bounds = [*starts[1:], float("inf")]
    restarts = []
    for number in range(1, len(starts)):
        before, after = segments[number - 1], segments[number]
        kept_through = _resumed_from(records, starts[number], bounds[number])
        cause, stopped_s, reached = _interruption(records, starts[number - 1], starts[number])
        crash = next(
            (e for e in records.of_kind(EventKind.RANK_FAILED) if starts[number - 1] <= e.time_s < starts[number]), None
        )
        last_row_s = max((s.time_s or 0.0 for s in before), default=None)
        interrupted = stopped_s if stopped_s is not None else (last_row_s or starts[number - 1])
        kept = [s.time_s or 0.0 for s in before if s.step <= kept_through]
        lost_from_s = max(kept) if kept else (min((_began_s(s) or 0.0 for s in before), default=interrupted))
        lost_rows = [s for s in before if s.step > kept_through]
        reached = max([s.step for s in before] + ([reached] if reached is not None else []), default=kept_through)
        resumed = min((b for s in after if (b := _began_s(s)) is not None), default=None)
        restarts.append(
            Restart(
                number=number,
                cause=cause,
                interrupted_s=interrupted,
                resumed_s=resumed,
                lost_steps=max(len(lost_rows), reached - kept_through, 0),
                lost_compute_s=max(interrupted - lost_from_s, 0.0),
                latency_s=None if resumed is None else resumed - interrupted,
                error=None if crash is None else crash_text(crash),
            )
        )
    return restarts


def _stalls(saves: Sequence[Event], restarts: list[Restart], last: float) -> list[Event]:
    """The saves training waited for: a save made after an interruption (the preemption save) is in its latency."""
    downtime = [(r.interrupted_s, r.resumed_s if r.resumed_s is not None else last) for r in restarts]
    return [e for e in saves if not any(since <= e.time_s <= until for since, until in downtime)]


def _breakdown(
    records: RunRecords,
    starts: list[float],
    segments: list[list[StepRecord]],
    restarts: list[Restart],
    stalls: Sequence[Event],
    origin: float,
    last: float,
) -> TimeBreakdown:
    """Split the wall time from ``origin`` to ``last`` into the disjoint parts of :class:`TimeBreakdown`."""
    last_index = {s.step: i for i, s in enumerate(records.steps)}
    productive = sum(records.steps[i].step_time_s or 0.0 for i in sorted(last_index.values()))
    lost_spans = [(r.interrupted_s - r.lost_compute_s, r.interrupted_s) for r in restarts]
    stall_outside_lost = sum(
        e.number("stall_s") or 0.0 for e in stalls if not any(since <= e.time_s <= until for since, until in lost_spans)
    )
    first_segment_end = min((_began_s(s) or 0.0 for s in segments[0]), default=None)
    if first_segment_end is None:
        first_segment_end = restarts[0].interrupted_s if restarts else last
    parts = {
        "queue_wait_s": starts[0] - origin,
        "startup_s": max(first_segment_end - starts[0], 0.0),
        "productive_s": productive,
        "checkpoint_stall_s": stall_outside_lost,
        "lost_work_s": sum(r.lost_compute_s for r in restarts),
        "restart_latency_s": sum(r.latency_s if r.latency_s is not None else last - r.interrupted_s for r in restarts),
    }
    return TimeBreakdown(**parts, other_s=(last - origin) - sum(parts.values()))


def _auto_interval(records: RunRecords, wasted_s: float, wall_s: float) -> AutoInterval | None:
    choices = records.of_kind(EventKind.CHECKPOINT_INTERVAL)
    if not choices:
        return None
    last = choices[-1]
    steps, cost, mtbf, expected = (last.number(k) for k in ("steps", "save_cost_s", "mtbf_h", "expected_waste"))
    if steps is None or cost is None or mtbf is None or expected is None:
        return None
    return AutoInterval(int(steps), cost, mtbf, expected, wasted_s / wall_s if wall_s > 0 else None)


def _cost(records: RunRecords, starts: list[float], last: float, breakdown: TimeBreakdown) -> Cost:
    """Allocated time: the wall time less the queue wait and each requeued job's wait to start again.

    A start's allocation ends with the last thing it recorded (its requeue, stop or last step).
    """
    pending = 0.0
    for previous, start in itertools.pairwise(starts):
        recorded = [e.time_s for e in records.events if previous <= e.time_s < start]
        recorded += [s.time_s for s in records.steps if s.time_s is not None and previous <= s.time_s < start]
        pending += start - max(recorded, default=previous)
    allocated = max(breakdown.wall_s - breakdown.queue_wait_s - pending, 0.0)
    hours = records.gpus / 3600.0
    return Cost(
        gpus=records.gpus,
        allocated_s=allocated,
        gpu_hours_used=allocated * hours,
        gpu_hours_lost=max(allocated - breakdown.productive_s, 0.0) * hours,
        usd_per_gpu_hour=records.usd_per_gpu_hour,
    )


def stragglers_seen(records: RunRecords) -> tuple[StragglerSeen, ...]:
    """Each straggler node once, as first reported."""
    seen: dict[str, StragglerSeen] = {}
    for event in records.of_kind(EventKind.STRAGGLER):
        node = event.fields.get("node")
        if isinstance(node, str) and node not in seen:
            step = event.number("step")
            excluded = event.fields.get("excluded") is True
            seen[node] = StragglerSeen(node, int(step) if step is not None else None, event.number("ratio"), excluded)
    return tuple(seen.values())


def _share(part: float, whole: float) -> str:
    return f" ({100 * part / whole:.1f}% of wall)" if whole > 0 else ""


BREAKDOWN_WORDS = (
    ("queue_wait_s", "queue wait", "submission to the first start"),
    ("startup_s", "start-up", "first start to its first step: launch, imports, model build, loading"),
    ("productive_s", "productive", "steps that counted"),
    ("checkpoint_stall_s", "checkpoint stall", "training waiting for saves"),
    ("lost_work_s", "lost work", "steps trained again after a restart"),
    ("restart_latency_s", "restart latency", "interruption to the first step after it"),
    ("other_s", "other", "between steps and after the last: logging, metrics, the final save's tail"),
)


def format_report(report: RunReport) -> str:
    total = f"/{report.total_steps}" if report.total_steps else ""
    goodput = f"{100 * report.goodput:.1f}%" if report.goodput is not None else "n/a"
    since = "the first submission" if report.submitted_s is not None else "the first start"
    lines = [
        f"steps        {report.steps_done}{total}",
        f"wall time    {report.wall_s:.1f} s since {since}",
    ]
    parts = asdict(report.breakdown)
    for key, name, what in BREAKDOWN_WORDS:
        lines.append(f"  {name:<17}{parts[key]:>8.1f} s {_percent(parts[key], report.wall_s):>6}  {what}")
    lines += [
        f"goodput      {goodput}",
        f"restarts     {len(report.restarts)}, {report.lost_s:.1f} s lost{_share(report.lost_s, report.wall_s)}",
    ]
    for r in report.restarts:
        latency = f"{r.latency_s:.1f} s" if r.latency_s is not None else "not resumed yet"
        lines.append(
            f"  #{r.number} {r.cause:<10} lost {r.lost_steps} step(s) ({r.lost_compute_s:.1f} s) + "
            f"restart latency {latency} = {r.lost_s:.1f} s" + (f"; {r.error}" if r.error else "")
        )
    if report.starts_to_first_step_s:
        starts = ", ".join(f"{s:.1f}" for s in report.starts_to_first_step_s)
        lines.append(f"start-ups    {starts} s from process creation to first step, per start")
    for s in report.stragglers:
        ratio = f", {s.ratio:.1f}x the others" if s.ratio is not None else ""
        at = f" at step {s.step}" if s.step is not None else ""
        excluded = "; on the bad-node list" if s.excluded else ""
        lines.append(f"straggler    {s.node}{at}{ratio}{excluded}")
    lines.append(
        f"checkpoints  {report.checkpoints} saved, training waited {report.checkpoint_stall_s:.2f} s"
        f"{_share(report.checkpoint_stall_s, report.wall_s)}, writing took {report.checkpoint_write_s:.2f} s"
    )
    lines.append(_format_cost(report.cost))
    auto = report.auto_interval
    if auto is not None:
        measured = f"{100 * auto.measured_waste:.1f}%" if auto.measured_waste is not None else "n/a"
        lines.append(
            f"interval     auto: every {auto.steps} step(s) for a {auto.save_cost_s:.2f} s save and MTBF "
            f"{auto.mtbf_h:g} h; loss to saves and redone work expected {100 * auto.expected_waste:.1f}%, "
            f"measured {measured}"
        )
    if report.stopped_because:
        lines.append(f"stopped      {report.stopped_because}")
    return "\n".join(lines)


def _percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole > 0 else ""


def _format_cost(cost: Cost) -> str:
    allocated_h = cost.allocated_s / 3600.0
    if not cost.gpus:
        return f"GPU-hours    none: CPU hardware (allocated {allocated_h:.3f} h)"
    line = (
        f"GPU-hours    {cost.gpu_hours_used:.2f} used ({cost.gpus} GPUs x {allocated_h:.3f} h allocated), "
        f"{cost.gpu_hours_lost:.2f} lost{_share(cost.gpu_hours_lost, cost.gpu_hours_used).replace('wall', 'used')}"
    )
    if cost.usd_used is None or cost.usd_lost is None:
        return line + "; no price (hardware.usd_per_gpu_hour)"
    return (
        line + f"; cost ${cost.usd_used:,.2f}, of which ${cost.usd_lost:,.2f} lost (at ${cost.usd_per_gpu_hour}/GPU-h)"
    )
