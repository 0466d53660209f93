"""The restart budget for crash loops: starts in a row that ended without a new checkpoint.

A run that restarts on a hang, a bad node or Slurm's requeue but never saves again
(the same fault on every start, a corrupt input, a filesystem that is full) would
otherwise requeue until ``resilience.max_restarts`` is spent, each time paying the
queue wait and start-up. Each start's rank 0 writes a ``start`` event with its
generation; a start made progress when a ``checkpoint_saved`` event follows it
before the next start. Every rank reads the same finished history, so all agree
without a collective.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from air_hpc.errors import AirHpcError
from air_hpc.exitcodes import ExitCode
from air_hpc.records.events import EventKind

__all__ = ["CrashLoopError", "check_progress", "no_progress_restarts", "starts"]


class CrashLoopError(AirHpcError):
    """Too many restarts in a row made no progress; the batch script does not requeue this code."""

    exit_code = ExitCode.CRASH_LOOP


@dataclass(frozen=True)
class StartRecord:
    generation: str
    saved_steps: tuple[int, ...]
    """Checkpoints committed between this start and the next."""


def starts(events: Iterable[Mapping[str, Any]]) -> list[StartRecord]:
    """Every start in the event log, in order, with the checkpoints saved during it."""
    records: list[tuple[str, list[int]]] = []
    for event in events:
        kind = event.get("kind")
        if kind == EventKind.START and isinstance(event.get("generation"), str):
            records.append((event["generation"], []))
        elif kind == EventKind.CHECKPOINT_SAVED and records and isinstance(event.get("step"), int):
            records[-1][1].append(event["step"])
    return [StartRecord(generation, tuple(steps)) for generation, steps in records]


def no_progress_restarts(events: Iterable[Mapping[str, Any]], current: str) -> tuple[int, int | None]:
    """(starts in a row before ``current`` that saved nothing, the newest checkpoint step before them or None)."""
    previous = [s for s in starts(events) if s.generation != current]
    count = 0
    for record in reversed(previous):
        if record.saved_steps:
            return count, max(record.saved_steps)
        count += 1
    return count, None


def check_progress(events: Iterable[Mapping[str, Any]], current: str, limit: int) -> str | None:
    """Why this start must not train (``limit`` restarts in a row made no progress), or None."""
    count, last_step = no_progress_restarts(events, current)
    if count < limit:
        return None
    since = f"step {last_step}" if last_step is not None else "the first start"
    return (
        f"{count} restarts in a row made no progress (no new checkpoint since {since}); "
        f"resilience.max_no_progress_restarts is {limit}: stopping instead of requeueing again"
    )
