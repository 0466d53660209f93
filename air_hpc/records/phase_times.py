"""``phase_times.json``: the phase times a run has seen, kept across its starts for the learned hang limits.

Rank 0 rewrites it (atomically, not fsynced: losing the newest samples to a crash costs
nothing but a few samples) while it trains; every rank reads it once when it starts, so a
restarted job watches its setup, load, steps and saves with the limits its predecessors
learned (``health.limits``). The file is untrusted input: anything that is not a finite
positive number under a known phase is dropped, and a file that cannot be read at all
counts as none, with one warning.
"""

import json
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from air_hpc.records.files import atomic_write

log = logging.getLogger(__name__)

#: Samples kept per phase: the newest, enough for a 99th percentile that is not just the maximum.
MAX_SAMPLES = 500
VERSION = 1


def read_phase_times(path: Path, phases: Sequence[str]) -> dict[str, tuple[float, ...]]:
    """Each of ``phases``' samples from ``path`` (oldest first, at most :data:`MAX_SAMPLES`); none when absent."""
    empty: dict[str, tuple[float, ...]] = {phase: () for phase in phases}
    try:
        raw = json.loads(path.read_bytes())
    except FileNotFoundError:
        return empty
    except (OSError, ValueError) as exc:
        log.warning("%s: unreadable (%s); the hang limits start from the configured values", path, exc)
        return empty
    stored = raw.get("phases") if isinstance(raw, dict) else None
    if not isinstance(stored, dict):
        log.warning("%s: no 'phases' object; the hang limits start from the configured values", path)
        return empty
    return {phase: _samples(stored.get(phase)) for phase in phases}


def _samples(values: object) -> tuple[float, ...]:
    if not isinstance(values, list):
        return ()
    kept = [float(v) for v in values if _is_time(v)]
    return tuple(kept[-MAX_SAMPLES:])


def _is_time(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def write_phase_times(path: Path, samples: Mapping[str, Sequence[float]]) -> None:
    """Replace ``path`` by the newest :data:`MAX_SAMPLES` samples of each phase."""
    phases = {phase: [round(v, 6) for v in values[-MAX_SAMPLES:]] for phase, values in samples.items()}
    atomic_write(path, json.dumps({"version": VERSION, "phases": phases}), durable=False)
