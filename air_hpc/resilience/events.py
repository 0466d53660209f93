"""The run's event log: one JSON object per line, durable before ``emit`` returns.

Events are what a person reads after a preemption ("signal at 12:03, checkpoint
step 40 in 1.2 s, requeued, resumed from 40"), so each line is flushed and
fsynced: a crash right after ``emit`` must not lose it.
"""

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from air_hpc.rundir import read_jsonl

log = logging.getLogger(__name__)


class EventLog:
    """Appends events to ``path`` (normally ``RunDir(...).events``)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def emit(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Write ``{"time": ..., "kind": kind, **fields}`` as one line and fsync it."""
        event = {"time": time.time(), "kind": kind, **fields}
        line = json.dumps(event, sort_keys=False, default=str) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # O_APPEND keeps lines whole when several processes emit into one file.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        log.info("event %s %s", kind, fields)
        return event


def read_events(path: Path) -> list[dict[str, Any]]:
    """All events of a log; a torn last line (crash mid-write) is skipped with a warning."""
    return read_jsonl(path)
