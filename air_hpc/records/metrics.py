"""The run's per-step metrics (metrics.jsonl): its one reader, and the test of a whole line its writer keeps.

The trainer's ``MetricsWriter`` (``train.metrics``) appends one JSON object per
step; every tool that reads the steps (``status``, ``report``, ``plot``, ``compare``,
chaos campaigns, the demo, the benchmarks) reads them here, so a line torn by a
kill, or one that is not a step, is skipped the same way everywhere.
"""

import json
from pathlib import Path
from typing import Any

from air_hpc.records.jsonl import read_jsonl


def _is_step(row: dict[str, Any]) -> bool:
    step = row.get("step")
    return isinstance(step, int) and not isinstance(step, bool)


def step_of(line: str | bytes) -> int | None:
    """The step of one whole metrics line, else None (torn, not UTF-8 JSON, or no integer ``step``)."""
    try:
        row = json.loads(line)
    except ValueError:  # UnicodeDecodeError included
        return None
    return row["step"] if isinstance(row, dict) and _is_step(row) else None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every whole step record of a ``metrics.jsonl``, in order; none when the file does not exist."""
    return [row for row in read_jsonl(path) if _is_step(row)]
