"""JSON-lines run files (events.jsonl, submissions.jsonl): one schema, one reader, one appender.

Every line is an object ``{"time": <epoch s>, "kind": <what happened>, ...}``.
Readers trust nothing on disk: a line torn by a killed writer, or one that is not
UTF-8, is skipped and counted, and lines written before the schema was shared
(``"event"`` instead of ``"kind"``) are read as if they said ``"kind"``.
"""

import json
import logging
from pathlib import Path
from typing import Any

from air_hpc.records.files import append_bytes
from air_hpc.records.names import KIND, LEGACY_KIND

log = logging.getLogger(__name__)


def record(kind: str, time_s: float, **fields: Any) -> dict[str, Any]:
    """One line of a run file, in the shared schema."""
    return {"time": time_s, KIND: kind, **fields}


def append(path: Path, row: dict[str, Any], *, durable: bool = False) -> None:
    """Append ``row`` as one line; ``durable``: fsync before returning (a crash right after must not lose it).

    O_APPEND with one ``write`` keeps lines whole when several processes append to one file; a link at
    ``path`` is refused (``records.files``).
    """
    append_bytes(path, (json.dumps(row, default=str) + "\n").encode(), durable=durable)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The objects of a JSON-lines run file.

    Read as bytes: a line torn by a killed writer, or one that is not UTF-8 (garbage appended by
    anyone), is skipped and counted in one warning, never a crash of the tool reading the file.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    rows, skipped = [], []
    for number, raw in enumerate(data.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
        except ValueError:  # UnicodeDecodeError and JSONDecodeError both
            skipped.append(number)
            continue
        if isinstance(row, dict):
            if KIND not in row and LEGACY_KIND in row:
                row[KIND] = row.pop(LEGACY_KIND)
            rows.append(row)
    if skipped:
        shown = ", ".join(map(str, skipped[:5])) + (", ..." if len(skipped) > 5 else "")
        log.warning(
            "%s: skipped %d line(s) that are not whole UTF-8 JSON (torn write?): line %s", path, len(skipped), shown
        )
    return rows
