"""Goodput and what each restart cost, from a run's records.

- goodput = productive training time / wall time since the first start, where
  productive time is the step time of every step that survived (a step
  trained again after a restart counts once, its lost first run not at all);
- each restart loses the time spent on steps after the checkpoint it resumed
  from (trained again later) plus its latency: from the interruption (the
  stop, hang or unhealthy event) to the start of the first step after it
  (the preemption save, the requeue wait, start-up and loading the checkpoint);
- checkpoint overhead is the time training waited for saves (``stall_s`` of
  ``checkpoint_saved`` events; an async save stalls only while it snapshots),
  except saves made after an interruption, which count in its latency.
"""

import bisect
from dataclasses import asdict, dataclass

from air_hpc.observe.records import CHECKPOINT_KIND, FAULT_KINDS, PREEMPT_KINDS, RESUME_KIND, RunRecords, StepRecord


@dataclass(frozen=True)
class Restart:
    number: int
    """1 for the first restart."""
    cause: str
    """``preemption``, ``hang``, ``unhealthy`` or ``unknown``."""
    interrupted_s: float
    """When the start was stopped (its stop, hang or unhealthy event; else its last step or its start)."""
    resumed_s: float | None
    """Start of the first step after the restart; None while it has not trained yet."""
    lost_steps: int
    lost_compute_s: float
    latency_s: float | None

    @property
    def lost_s(self) -> float:
        return self.lost_compute_s + (self.latency_s or 0.0)


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

    @property
    def lost_s(self) -> float:
        return sum(r.lost_s for r in self.restarts)

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["restarts"] = [{**asdict(r), "lost_s": r.lost_s} for r in self.restarts]
        data["lost_s"] = self.lost_s
        return data


def _began_s(step: StepRecord) -> float | None:
    return None if step.time_s is None else step.time_s - (step.step_time_s or 0.0)


def _interruption(records: RunRecords, since_s: float, until_s: float) -> tuple[str, float | None, int | None]:
    """(cause, time, last completed step) of what ended the start running from ``since_s`` to ``until_s``."""
    for event in reversed([e for e in records.events if since_s <= e.time_s < until_s]):
        step = event.number("step")
        if event.kind in FAULT_KINDS:
            # A hang is noticed inside the step it names; that step did not complete.
            return event.kind, event.time_s, int(step) - 1 if step is not None else None
        if event.kind in PREEMPT_KINDS:
            return "preemption", event.time_s, int(step) if step is not None else None
    return "unknown", None, None


def _resumed_from(records: RunRecords, since_s: float, until_s: float) -> int:
    """The checkpoint step a start resumed from (0: from scratch)."""
    steps = [e.number("step") for e in records.of_kind(RESUME_KIND) if since_s <= e.time_s < until_s]
    return int(steps[0]) if steps and steps[0] is not None else 0


def build_report(records: RunRecords) -> RunReport | None:
    """The report of a run that has trained or started at least once; None before that.

    Works whether the trainer kept the records of steps it trained again
    (then they are counted) or dropped them on resume (then the interruption's
    event says which step was reached, and time tells the rest).
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
    last_index = {s.step: i for i, s in enumerate(records.steps)}
    survivors = [records.steps[i] for i in sorted(last_index.values())]
    productive = sum(s.step_time_s or 0.0 for s in survivors)
    bounds = [*starts[1:], float("inf")]
    restarts = []
    for number in range(1, len(starts)):
        before, after = segments[number - 1], segments[number]
        kept_through = _resumed_from(records, starts[number], bounds[number])
        cause, stopped_s, reached = _interruption(records, starts[number - 1], starts[number])
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
            )
        )
    last = max([s.time_s or 0.0 for s in timed] + [e.time_s for e in records.events] + [starts[-1]])
    wall = last - starts[0]
    saves = records.of_kind(CHECKPOINT_KIND)
    # A save made after an interruption (the preemption save) is part of that restart's latency.
    downtime = [(r.interrupted_s, r.resumed_s if r.resumed_s is not None else last) for r in restarts]
    stalls = [e for e in saves if not any(since <= e.time_s <= until for since, until in downtime)]
    return RunReport(
        first_start_s=starts[0],
        last_activity_s=last,
        wall_s=wall,
        productive_s=productive,
        goodput=productive / wall if wall > 0 else None,
        steps_done=max((s.step for s in records.steps), default=0),
        total_steps=records.total_steps,
        restarts=tuple(restarts),
        checkpoints=len(saves),
        checkpoint_stall_s=sum(e.number("stall_s") or 0.0 for e in stalls),
        checkpoint_write_s=sum(e.number("seconds") or 0.0 for e in saves),
    )


def _share(part: float, whole: float) -> str:
    return f" ({100 * part / whole:.1f}% of wall)" if whole > 0 else ""


def format_report(report: RunReport) -> str:
    total = f"/{report.total_steps}" if report.total_steps else ""
    goodput = f"{100 * report.goodput:.1f}%" if report.goodput is not None else "n/a"
    lines = [
        f"steps        {report.steps_done}{total}",
        f"wall time    {report.wall_s:.1f} s since the first start",
        f"productive   {report.productive_s:.1f} s of training that counted",
        f"goodput      {goodput}",
        f"restarts     {len(report.restarts)}, {report.lost_s:.1f} s lost{_share(report.lost_s, report.wall_s)}",
    ]
    for r in report.restarts:
        latency = f"{r.latency_s:.1f} s" if r.latency_s is not None else "not resumed yet"
        lines.append(
            f"  #{r.number} {r.cause:<10} lost {r.lost_steps} step(s) ({r.lost_compute_s:.1f} s) + "
            f"restart latency {latency} = {r.lost_s:.1f} s"
        )
    lines.append(
        f"checkpoints  {report.checkpoints} saved, training waited {report.checkpoint_stall_s:.2f} s"
        f"{_share(report.checkpoint_stall_s, report.wall_s)}, writing took {report.checkpoint_write_s:.2f} s"
    )
    return "\n".join(lines)
