"""What each injected fault cost, and the campaign's verdict: pure functions of the run's records.

Per fault: when it was noticed (the first event that reacts to it: the batch
shell's signal, a stop, hang or requeue), how long until the first step after
the restart (the next ``start`` event) finished, and how many steps had to be
trained again: the furthest step reached (logged when it struck, or before the
restart) less the checkpoint step the restart loaded (0 when none was usable). A
restart that resumed at the last step had nothing left to train: it recovered
when it resumed. "Nothing lost" means the run completed, every fault that struck
was recovered from, and every logged loss and the final weights equal the
uninterrupted reference's bit for bit; steps trained again are work lost,
reported, not state lost, and a fault skipped (the run had no training left, or
the job ended, before it could strike) tested nothing and lost nothing: it is
reported with its reason, not as a loss. The exit code says what the verdict says.

Seconds lost, per fault: the wall time in which the run made no new progress because of it.
For a fault the job restarts after, from the moment the furthest step reached before the
restart was logged until the restarted run is back there: the downtime (until the first
step after the restart began; that step is counted as one typical step of training) plus
the steps trained again at the run's typical step time (the median of its steps). A
preemption that saved its last step loses only the downtime. For a fault ridden out
without a restart (a straggler), the time its steps took beyond the typical step.
"""

import statistics
from dataclasses import asdict, dataclass

from air_hpc.chaos.schedule import NO_RESTART_KINDS, Fault
from air_hpc.exitcodes import ExitCode
from air_hpc.observe.compare import Comparison
from air_hpc.observe.records import Event, RunRecords, StepRecord
from air_hpc.records.events import RESUME_KINDS, EventKind

#: Events that show the job noticed a fault (the batch shell, the ranks' stop, the watchdog, the pre-flight
#: check, the supervisor's dead node, a rank's exception, the requeue, the supervisor's in-job restart: the
#: ranks beside a killed one may be ended before they can record their own failure).
DETECTION_KINDS = frozenset(
    {
        EventKind.SIGNAL,
        EventKind.STOP,
        EventKind.HANG,
        EventKind.UNHEALTHY,
        EventKind.NODE_DEAD,
        EventKind.RANK_FAILED,
        EventKind.REQUEUE,
        EventKind.IN_JOB_RESTART,
        EventKind.STRAGGLER,
    }
)


@dataclass(frozen=True)
class Injection:
    fault: Fault
    injected_s: float
    target: str
    """What was hit: ``job 12 batch``, ``rank 3 pid 4242 on n2``, ``node n3``."""
    step: int = 0
    """The last step logged when it struck (a resume may drop the metrics of steps trained again)."""
    skipped: str = ""
    """Why the fault was not injected (the run had no training left, the job ended): it tested nothing, lost
    nothing."""


@dataclass(frozen=True)
class FaultOutcome:
    number: int
    kind: str
    target: str
    injected_s: float
    detected_after_s: float | None
    resumed_after_s: float | None
    """Injection to the end of the first step trained after it (None: training never went on)."""
    resumed_from_step: int | None
    """The checkpoint step the restart loaded; None when the fault caused no restart."""
    steps_lost: int
    skipped: str = ""
    """Why the fault tested nothing (not injected, or it struck after the run's last step); empty when it did."""
    seconds_lost: float | None = 0.0
    """Wall time without new progress because of the fault (see the module docstring); None when never recovered."""
    detected_by: str = ""
    """The event that noticed it; for a hang, also which limit fired and how it was derived."""

    @property
    def lost(self) -> bool:
        """It struck and training never went on after it."""
        return not self.skipped and self.resumed_after_s is None


@dataclass(frozen=True)
class CampaignResult:
    scheduled: int
    """Faults the schedule held; fewer outcomes mean the job ended before the rest could strike."""
    faults: tuple[FaultOutcome, ...]
    final_state: str
    comparison: Comparison
    goodput: float | None
    reference_goodput: float | None
    wall_s: float | None = None
    """The faulted copy's wall time (first submission to its last record), beside the reference's."""
    reference_wall_s: float | None = None

    @property
    def steps_lost(self) -> int:
        return sum(f.steps_lost for f in self.faults)

    @property
    def seconds_lost(self) -> float:
        """The faults' lost seconds together (a fault never recovered from adds none: the verdict says LOST)."""
        return sum(f.seconds_lost or 0.0 for f in self.faults)

    @property
    def extra_wall_s(self) -> float | None:
        """How much longer the faulted copy took than the reference, which ran at the same time."""
        if self.wall_s is None or self.reference_wall_s is None:
            return None
        return self.wall_s - self.reference_wall_s

    def losses(self) -> tuple[str, ...]:
        """Every way the campaign lost something; empty when nothing was lost."""
        comparison = self.comparison
        found = [] if self.final_state == "COMPLETED" else [f"final state {self.final_state}"]
        found += [f"fault {f.number} ({f.kind}) not recovered from" for f in self.faults if f.lost]
        if len(self.faults) < self.scheduled:
            found.append(f"{self.scheduled - len(self.faults)} scheduled fault(s) without an outcome")
        found += [] if comparison.losses_equal else ["losses differ from the reference"]
        found += [] if comparison.weights_equal else [f"weights differ: {comparison.weights_note}"]
        return tuple(found)

    @property
    def nothing_lost(self) -> bool:
        return not self.losses()

    @property
    def verdict(self) -> str:
        """One line: ``nothing lost`` (with the faults that were skipped, if any) or ``LOST: <why>``."""
        if lost := self.losses():
            return "LOST: " + "; ".join(lost)
        skipped = sum(bool(f.skipped) for f in self.faults)
        return "nothing lost" + (f" ({skipped} of {self.scheduled} fault(s) skipped, see above)" if skipped else "")

    @property
    def exit_code(self) -> ExitCode:
        """The command's exit status: the verdict, never anything else."""
        return ExitCode.OK if self.nothing_lost else ExitCode.FAILURE

    def to_json(self) -> dict[str, object]:
        return {
            "verdict": self.verdict,
            "exit_code": int(self.exit_code),
            "scheduled": self.scheduled,
            "faults": [asdict(f) for f in self.faults],
            "final_state": self.final_state,
            "losses_equal": self.comparison.losses_equal,
            "weights_equal": self.comparison.weights_equal,
            "loss_mismatches": list(self.comparison.loss_mismatches),
            "weights_note": self.comparison.weights_note,
            "goodput": self.goodput,
            "reference_goodput": self.reference_goodput,
            "steps_lost": self.steps_lost,
            "seconds_lost": round(self.seconds_lost, 3),
            "wall_s": self.wall_s,
            "reference_wall_s": self.reference_wall_s,
            "extra_wall_s": self.extra_wall_s,
            "nothing_lost": self.nothing_lost,
        }


def _skipped(injection: Injection, reason: str) -> FaultOutcome:
    fault = injection.fault
    return FaultOutcome(fault.number, fault.kind, injection.target, injection.injected_s, None, None, None, 0, reason)


@dataclass(frozen=True)
class _Restarted:
    first_s: float | None
    """When the first step after the restart finished (None: training never went on)."""
    resumed_from: int
    steps_lost: int
    reached_s: float
    """When the furthest step reached before the restart was logged (else the injection's time)."""


def _restart_outcome(
    records: RunRecords, injection: Injection, events: list[Event], restart: Event, after: list[StepRecord]
) -> _Restarted:
    """When training went on, the step it resumed from, the steps lost, and when the lost progress was reached."""
    resume = next((e for e in events if e.kind in RESUME_KINDS and e.time_s >= restart.time_s), None)
    step = resume.number("step") if resume else None
    resumed_from = int(step) if step is not None else 0  # no resume event: started from scratch
    first_step = next((s.time_s for s in after if s.time_s is not None and s.time_s > restart.time_s), None)
    # The restart's own record of its first step: metrics of steps a later fault made the run train again
    # are dropped at that resume, but events are never rewritten.
    startup = next((e.time_s for e in events if e.kind == EventKind.STARTUP and e.time_s > restart.time_s), None)
    first_s = min((t for t in (first_step, startup) if t is not None), default=None)
    if first_s is None and resume is not None and records.total_steps and resumed_from >= records.total_steps:
        first_s = resume.time_s  # it resumed at the last step: nothing was left to train
    before = [s for s in records.steps if s.time_s is not None and s.time_s < restart.time_s]
    reached = max(max((s.step for s in before), default=0), injection.step)
    last = max(before, key=lambda s: s.time_s or 0.0, default=None)
    reached_s = last.time_s if last is not None and last.time_s is not None and last.step >= reached else None
    return _Restarted(first_s, resumed_from, max(reached - resumed_from, 0), reached_s or injection.injected_s)


def typical_step_s(records: RunRecords) -> float:
    """The run's typical step time: the median of its logged steps' (0 when none is known)."""
    times = [s.step_time_s for s in records.steps if s.step_time_s is not None and s.step_time_s > 0]
    return statistics.median(times) if times else 0.0


def _seconds_lost(restarted: _Restarted, step_s: float) -> float | None:
    """Downtime (the first step after the restart counts as one typical step) plus the steps trained again."""
    if restarted.first_s is None:
        return None
    downtime = max(restarted.first_s - step_s - restarted.reached_s, 0.0)
    return round(downtime + restarted.steps_lost * step_s, 3)


def _detected_by(events: list[Event]) -> tuple[float | None, str]:
    """When the first detection event came (its time) and what it says: its kind, and a hang's limit."""
    event = next((e for e in events if e.kind in DETECTION_KINDS), None)
    if event is None:
        return None, ""
    limit = event.fields.get("limit")
    return event.time_s, f"{event.kind}: {limit}" if event.kind == EventKind.HANG and limit else str(event.kind)


def fault_outcome(
    records: RunRecords, injection: Injection, until_s: float, step_s: float | None = None
) -> FaultOutcome:
    """The outcome of one fault, from the records between its injection and ``until_s`` (the next one's).

    ``step_s``: the run's typical step time (default: :func:`typical_step_s` of ``records``)."""
    since = injection.injected_s
    if injection.skipped:
        return _skipped(injection, injection.skipped)
    typical = typical_step_s(records) if step_s is None else step_s
    events = [e for e in records.events if since <= e.time_s < until_s]
    detected_s, detected_by = _detected_by(events)
    restart = next((e for e in events if e.kind == EventKind.START), None)
    after = [s for s in records.steps if s.time_s is not None and since < s.time_s < until_s]
    total = records.total_steps
    if (
        restart is None
        and injection.fault.kind not in NO_RESTART_KINDS
        and total
        and _finished_untouched(records, after, total)
    ):
        return _skipped(injection, f"struck as the run ended (step {total} of {total}): nothing was left to recover")
    if restart is None:  # recovered only if the kind needs no restart: then the first step after it counts
        first_s = after[0].time_s if after and injection.fault.kind in NO_RESTART_KINDS else None
        resumed_from, lost = None, 0
        slower = sum(max((s.step_time_s or 0.0) - typical, 0.0) for s in after)
        seconds_lost = None if first_s is None else round(slower, 3)
    else:
        restarted = _restart_outcome(records, injection, events, restart, after)
        first_s, resumed_from, lost = restarted.first_s, restarted.resumed_from, restarted.steps_lost
        seconds_lost = _seconds_lost(restarted, typical)
    return FaultOutcome(
        number=injection.fault.number,
        kind=injection.fault.kind,
        target=injection.target,
        injected_s=since,
        detected_after_s=None if detected_s is None else detected_s - since,
        resumed_after_s=None if first_s is None else first_s - since,
        resumed_from_step=resumed_from,
        steps_lost=lost,
        seconds_lost=seconds_lost,
        detected_by=detected_by,
    )


def _finished_untouched(records: RunRecords, after: list[StepRecord], total: int) -> bool:
    """The run logged its last step and trained nothing else after the fault: it struck too late to matter."""
    return any(s.step >= total for s in records.steps) and all(s.step >= total for s in after)


def outcomes(records: RunRecords, injections: list[Injection]) -> tuple[FaultOutcome, ...]:
    bounds = [i.injected_s for i in injections[1:]] + [float("inf")] * bool(injections)
    step_s = typical_step_s(records)
    return tuple(fault_outcome(records, i, until, step_s) for i, until in zip(injections, bounds, strict=True))


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _fault_lines(result: CampaignResult) -> list[str]:
    """A line per fault that struck (and what detected it, when there is more to say than the kind), then the
    skipped ones with why."""
    lines = [f"{'#':>2} {'kind':<13} {'detected':>9} {'resumed':>9} {'from':>5} {'steps':>5} {'lost':>8}  target"]
    for f in (f for f in result.faults if not f.skipped):
        resumed_from = "-" if f.resumed_from_step is None else str(f.resumed_from_step)
        lines.append(
            f"{f.number:>2} {f.kind:<13} {_seconds(f.detected_after_s):>9} {_seconds(f.resumed_after_s):>9} "
            f"{resumed_from:>5} {f.steps_lost:>5} {_seconds(f.seconds_lost):>8}  {f.target}"
        )
        if ":" in f.detected_by:
            lines.append(f"{'':>3}detected by {f.detected_by}")
    return lines + [f"{f.number:>2} {f.kind:<13} skipped: {f.skipped}" for f in result.faults if f.skipped]


def _lost_line(result: CampaignResult) -> str:
    struck = sum(not f.skipped for f in result.faults)
    line = f"lost         {result.steps_lost} step(s), {result.seconds_lost:.1f}s in {struck} fault(s)"
    extra = result.extra_wall_s
    if extra is not None:
        line += f"; the run took {abs(extra):.1f}s {'longer' if extra >= 0 else 'less'} than the reference"
    return line


def _goodput_line(result: CampaignResult) -> str:
    line = f"goodput      {_percent(result.goodput)} (reference {_percent(result.reference_goodput)}"
    if result.goodput is not None and result.reference_goodput is not None:
        line += f", {100 * (result.goodput - result.reference_goodput):+.1f} points"
    return line + ")"


def format_result(result: CampaignResult) -> str:
    lines = _fault_lines(result)
    comparison = result.comparison
    same = "bit-for-bit equal to the reference"
    lines += [
        f"final state  {result.final_state}",
        f"losses       {same if comparison.losses_equal else 'DIFFER'}",
        *(f"  {m}" for m in comparison.loss_mismatches[:5]),
        f"weights      {same if comparison.weights_equal else 'DIFFER: ' + comparison.weights_note}",
        _lost_line(result),
        _goodput_line(result),
        f"verdict      {result.verdict}",
    ]
    return "\n".join(lines)
