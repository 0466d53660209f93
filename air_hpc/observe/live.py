"""The live view of a run: one rich panel on a terminal, one plain line per change elsewhere.

Rendering is pure (a :class:`LiveView` in, a renderable or a line out) so it is
tested with a fixed-width console; :func:`air_hpc.ops.control.watch_run`
drives it from the run's files and the job's state.
"""

from dataclasses import dataclass

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table

from air_hpc.observe.progress import RunProgress, format_duration
from air_hpc.observe.records import Event, RunRecords

#: Event fields worth showing beside the kind, in this order.
EVENT_DETAILS = ("step", "reason", "signal", "exit_code")


@dataclass(frozen=True)
class LiveView:
    run: str
    job_id: str
    state: str
    restarts: int
    progress: RunProgress | None
    last_event: str | None


def describe_event(event: Event, now_s: float) -> str:
    details = ", ".join(f"{key} {event.fields[key]}" for key in EVENT_DETAILS if key in event.fields)
    return f"{event.kind}{f' ({details})' if details else ''}, {format_duration(now_s - event.time_s)} ago"


def last_event(records: RunRecords, now_s: float) -> str | None:
    return describe_event(records.events[-1], now_s) if records.events else None


def _step(progress: RunProgress | None) -> str:
    if progress is None:
        return "no step yet"
    total = f"/{progress.total_steps}" if progress.total_steps else ""
    percent = f" ({100 * progress.fraction:.0f}%)" if progress.fraction is not None else ""
    return f"step {progress.step}{total}{percent}"


def plain_line(view: LiveView) -> str:
    """One line for logs and pipes: state, step, loss, throughput, ETA, restarts, last event."""
    parts = [f"{view.run} job {view.job_id}: {view.state}", _step(view.progress)]
    p = view.progress
    if p is not None and p.loss is not None:
        parts.append(f"loss {p.loss:.4f}")
    if p is not None and p.tokens_per_s is not None:
        parts.append(f"{p.tokens_per_s:,.0f} tokens/s")
    if p is not None and p.eta_s is not None:
        parts.append(f"ETA {format_duration(p.eta_s)}")
    parts.append(f"restarts {view.restarts}")
    if view.last_event:
        parts.append(f"last: {view.last_event}")
    return ", ".join(parts)


def change_key(view: LiveView) -> tuple[object, ...]:
    """What must change for the plain view to print another line (not the clock-driven ETA or ages)."""
    step = view.progress.step if view.progress else None
    event = view.last_event.rpartition(", ")[0] if view.last_event else None
    return (view.state, step, view.restarts, event)


def live_panel(view: LiveView, bar_width: int = 40) -> RenderableType:
    """The terminal panel: state, a step/total bar, loss, tokens/s, ETA, restarts, last event."""
    p = view.progress
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    grid.add_row("state", view.state)
    total = (p.total_steps or p.step or 1) if p else 1
    bar = ProgressBar(total=total, completed=min(p.step, total) if p else 0, width=bar_width)
    grid.add_row("progress", Group(bar, _step(p)))
    grid.add_row("loss", f"{p.loss:.4f}" if p and p.loss is not None else "-")
    grid.add_row("tokens/s", f"{p.tokens_per_s:,.0f}" if p and p.tokens_per_s is not None else "-")
    grid.add_row("ETA", format_duration(p.eta_s) if p and p.eta_s is not None else "-")
    grid.add_row("restarts", str(view.restarts))
    grid.add_row("last event", view.last_event or "-")
    return Panel(grid, title=f"{view.run}", subtitle=f"job {view.job_id}", expand=False)
