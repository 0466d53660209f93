"""The run's event log (events.jsonl): one JSON object per line, durable before ``emit`` returns.

Events are what a person reads after a preemption ("signal at 12:03, checkpoint
step 40 in 1.2 s, requeued, resumed from 40"), so each line is flushed and
fsynced: a crash right after ``emit`` must not lose it. The batch script's
lines (signal, requeue, preempted) follow the same schema (``records.jsonl``).
"""

import logging
import time
from pathlib import Path
from typing import Any

from air_hpc.records.jsonl import append, read_jsonl, record

log = logging.getLogger(__name__)


class EventLog:
    """Appends events to ``path`` (normally ``RunDir(...).events``)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def emit(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Write ``{"time": now, "kind": kind, **fields}`` as one line and fsync it."""
        return self.emit_at(time.time(), kind, **fields)

    def emit_at(self, at_s: float, kind: str, **fields: Any) -> dict[str, Any]:
        """As :meth:`emit`, for a moment already passed (the batch shell's signal, noted on entry)."""
        event = record(kind, at_s, **fields)
        append(self.path, event, durable=True)
        log.info("event %s %s", kind, fields)
        return event


def read_events(path: Path) -> list[dict[str, Any]]:
    """All events of a log; a torn last line (crash mid-write) is skipped with a warning."""
    return read_jsonl(path)
