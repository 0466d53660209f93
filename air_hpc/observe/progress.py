"""How far a run is: step / total, throughput, ETA, restarts and the last checkpoint.

Read from the run's files only, so ``air-hpc status`` shows it for any
executor and after the job has left the queue.
"""

import statistics
from dataclasses import asdict, dataclass

from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table

from air_hpc.observe.records import RunRecords
from air_hpc.records.events import EventKind

#: Steps whose median time and throughput give the ETA (recent, robust to one slow step).
RECENT_STEPS = 10


@dataclass(frozen=True)
class RunProgress:
    step: int
    total_steps: int | None
    loss: float | None
    tokens_per_s: float | None
    eta_s: float | None
    restarts: int
    last_checkpoint_step: int | None
    last_checkpoint_age_s: float | None
    stragglers: tuple[str, ...] = ()
    """Nodes reported as stragglers (slower per step than the others)."""

    @property
    def fraction(self) -> float | None:
        return min(self.step / self.total_steps, 1.0) if self.total_steps else None

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    def describe(self) -> str:
        total = f"/{self.total_steps}" if self.total_steps else ""
        parts = [f"step {self.step}{total}"]
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4f}")
        if self.tokens_per_s is not None:
            parts.append(f"{self.tokens_per_s:,.0f} tokens/s")
        if self.eta_s is not None:
            parts.append(f"ETA {format_duration(self.eta_s)}")
        parts.append(f"restarts {self.restarts}")
        if self.last_checkpoint_step is not None:
            age = (
                f", {format_duration(self.last_checkpoint_age_s)} ago" if self.last_checkpoint_age_s is not None else ""
            )
            parts.append(f"last checkpoint step {self.last_checkpoint_step}{age}")
        if self.stragglers:
            parts.append(f"straggler(s) {','.join(self.stragglers)}")
        return ", ".join(parts)


def format_duration(seconds: float) -> str:
    whole = max(round(seconds), 0)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def run_progress(records: RunRecords, now_s: float) -> RunProgress | None:
    """Progress of a run that has finished at least one step; None before that."""
    if not records.steps:
        return None
    last = records.steps[-1]
    recent = records.steps[-RECENT_STEPS:]
    times = [s.step_time_s for s in recent if s.step_time_s is not None]
    rates = [s.tokens_per_s for s in recent if s.tokens_per_s is not None]
    remaining = max(records.total_steps - last.step, 0) if records.total_steps else None
    saves = records.of_kind(EventKind.CHECKPOINT_SAVED)
    saved = saves[-1] if saves else None
    saved_step = saved.number("step") if saved else None
    return RunProgress(
        step=last.step,
        total_steps=records.total_steps,
        loss=last.loss,
        tokens_per_s=statistics.median(rates) if rates else None,
        eta_s=remaining * statistics.median(times) if remaining is not None and times else None,
        restarts=max(len(records.starts_s) - 1, 0),
        last_checkpoint_step=int(saved_step) if saved_step is not None else None,
        last_checkpoint_age_s=now_s - saved.time_s if saved else None,
        stragglers=records.straggler_nodes,
    )


def progress_view(progress: RunProgress, width: int = 40) -> RenderableType:
    """A progress bar with the numbers beside it, for ``air-hpc status``."""
    line = Table.grid(padding=(0, 1))
    line.add_column()
    line.add_column()
    total = progress.total_steps or progress.step or 1
    percent = f"{100 * progress.fraction:3.0f}%" if progress.fraction is not None else ""
    line.add_row(ProgressBar(total=total, completed=min(progress.step, total), width=width), percent)
    return Group(line, progress.describe())
