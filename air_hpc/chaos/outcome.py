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
"""

from dataclasses import asdict, dataclass

from air_hpc.chaos.schedule import NO_RESTART_KINDS, Fault
from air_hpc.exitcodes import ExitCode
from air_hpc.observe.compare import Comparison
from air_hpc.observe.records import Event, RunRecords, StepRecord
from air_hpc.records.events import EventKind

#: Events that show the job noticed a fault (the batch shell, the ranks' stop, the watchdog, the pre-flight
#: check, the supervisor's dead node, a rank's exception, the requeue).
DETECTION_KINDS = frozenset(
    {
        EventKind.SIGNAL,
        EventKind.STOP,
        EventKind.HANG,
        EventKind.UNHEALTHY,
        EventKind.NODE_DEAD,
        EventKind.RANK_FAILED,
        EventKind.REQUEUE,
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
            "nothing_lost": self.nothing_lost,
        }


def _skipped(injection: Injection, reason: str) -> FaultOutcome:
    fault = injection.fault
    return FaultOutcome(fault.number, fault.kind, injection.target, injection.injected_s, None, None, None, 0, reason)


def _restart_outcome(
    records: RunRecords, injection: Injection, events: list[Event], restart: Event, after: list[StepRecord]
) -> tuple[float | None, int, int]:
    """(when training went on, the step it resumed from, steps lost) for a fault the job restarted after."""
    resume = next((e for e in events if e.kind == EventKind.RESUME and e.time_s >= restart.time_s), None)
    step = resume.number("step") if resume else None
    resumed_from = int(step) if step is not None else 0  # no resume event: started from scratch
    first_step = next((s.time_s for s in after if s.time_s is not None and s.time_s > restart.time_s), None)
    # The restart's own record of its first step: metrics of steps a later fault made the run train again
    # are dropped at that resume, but events are never rewritten.
    startup = next((e.time_s for e in events if e.kind == EventKind.STARTUP and e.time_s > restart.time_s), None)
    first_s = min((t for t in (first_step, startup) if t is not None), default=None)
    if first_s is None and resume is not None and records.total_steps and resumed_from >= records.total_steps:
        first_s = resume.time_s  # it resumed at the last step: nothing was left to train
    before = [s.step for s in records.steps if s.time_s is not None and s.time_s < restart.time_s]
    return first_s, resumed_from, max(max(before, default=0), injection.step) - resumed_from


def fault_outcome(records: RunRecords, injection: Injection, until_s: float) -> FaultOutcome:
    """The outcome of one fault, from the records between its injection and ``until_s`` (the next one's)."""
    since = injection.injected_s
    if injection.skipped:
        return _skipped(injection, injection.skipped)
    events = [e for e in records.events if since <= e.time_s < until_s]
    detected = next((e.time_s - since for e in events if e.kind in DETECTION_KINDS), None)
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
    else:
        first_s, resumed_from, lost = _restart_outcome(records, injection, events, restart, after)
    return FaultOutcome(
        number=injection.fault.number,
        kind=injection.fault.kind,
        target=injection.target,
        injected_s=since,
        detected_after_s=detected,
        resumed_after_s=None if first_s is None else first_s - since,
        resumed_from_step=resumed_from,
        steps_lost=max(lost, 0),
    )


def _finished_untouched(records: RunRecords, after: list[StepRecord], total: int) -> bool:
    """The run logged its last step and trained nothing else after the fault: it struck too late to matter."""
    return any(s.step >= total for s in records.steps) and all(s.step >= total for s in after)


def outcomes(records: RunRecords, injections: list[Injection]) -> tuple[FaultOutcome, ...]:
    bounds = [i.injected_s for i in injections[1:]] + [float("inf")] * bool(injections)
    return tuple(fault_outcome(records, i, until) for i, until in zip(injections, bounds, strict=True))


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def format_result(result: CampaignResult) -> str:
    lines = [f"{'#':>2} {'kind':<13} {'detected':>9} {'resumed':>9} {'from':>5} {'lost':>4}  target"]
    for f in (f for f in result.faults if not f.skipped):
        resumed_from = "-" if f.resumed_from_step is None else str(f.resumed_from_step)
        lines.append(
            f"{f.number:>2} {f.kind:<13} {_seconds(f.detected_after_s):>9} {_seconds(f.resumed_after_s):>9} "
            f"{resumed_from:>5} {f.steps_lost:>4}  {f.target}"
        )
    lines += [f"{f.number:>2} {f.kind:<13} skipped: {f.skipped}" for f in result.faults if f.skipped]
    comparison = result.comparison
    same = "bit-for-bit equal to the reference"
    lines += [
        f"final state  {result.final_state}",
        f"losses       {same if comparison.losses_equal else 'DIFFER'}",
        *(f"  {m}" for m in comparison.loss_mismatches[:5]),
        f"weights      {same if comparison.weights_equal else 'DIFFER: ' + comparison.weights_note}",
        f"goodput      {_percent(result.goodput)} (reference {_percent(result.reference_goodput)})",
        f"verdict      {result.verdict}",
    ]
    return "\n".join(lines)
