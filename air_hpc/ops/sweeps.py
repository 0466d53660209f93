"""Operations on a whole sweep: find it, list its elements best first, cancel it (or one element), follow it.

A sweep is found by name under the runs root (``<root>/<NAME>.sweep/``, :mod:`air_hpc.records.sweeps`);
``NAME/i`` names its element ``i``. Every element is an ordinary run, so each operation here is the
run's own operation (:mod:`air_hpc.ops.control`) applied element by element.
"""

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from air_hpc.digits import ascii_int
from air_hpc.errors import AirHpcError, UserError
from air_hpc.observe.overview import RunRow, run_row, unreadable_row
from air_hpc.ops.control import CancelOutcome, cancel_run, run_status
from air_hpc.ops.runs import is_run_dir, runs_root
from air_hpc.ops.waiting import poll_until
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import latest_submission
from air_hpc.records.sweeps import SweepElement, SweepRecord, read_sweep, sweep_dir
from air_hpc.slurm.client import SlurmClient
from air_hpc.slurm.jobs import JobState

log = logging.getLogger(__name__)


def find_sweep(target: str, root: Path | str | None = None) -> SweepRecord | None:
    """The sweep ``target`` names (its name under the runs root, or its ``NAME.sweep`` directory); None if none.

    A run of the same name wins: ``status NAME`` keeps meaning that run.
    """
    path = Path(target).expanduser()
    if path.is_dir() and path.name.endswith(".sweep"):
        return read_sweep(path)
    if path.name != target:
        return None
    base = runs_root(root)
    if is_run_dir(base / target) or not sweep_dir(base, target).is_dir():
        return None
    return read_sweep(sweep_dir(base, target))


def find_element(target: str, root: Path | str | None = None) -> tuple[SweepRecord, SweepElement] | None:
    """``NAME/i``: the sweep and its element ``i``; None when ``target`` is not of that form or names no sweep."""
    name, sep, index_text = target.rpartition("/")
    index = ascii_int(index_text)
    if not sep or index is None or Path(target).exists():
        return None
    record = find_sweep(name, root)
    return None if record is None else (record, record.element(index))


def runs_row(run_dir: RunDir, client: SlurmClient) -> RunRow:
    """One run's row of ``air-hpc runs``; a run whose records cannot be read is marked, not fatal to the list."""
    state, job_id, restarts, reason = "not submitted", None, None, ""
    try:
        job_id = latest_submission(run_dir).job_id
        status = run_status(run_dir, client)
        state, restarts = str(status.job.state), status.restarts
        reason = status.job.reason if status.job.state is JobState.PENDING else ""
    except AirHpcError as exc:
        state = state if job_id is None else "unknown"
        log.info("%s: %s", run_dir.path, exc)
    try:
        return run_row(run_dir, state, job_id, restarts, time.time(), reason)
    except AirHpcError as exc:
        return unreadable_row(run_dir, job_id, str(exc))


@dataclass(frozen=True)
class ElementRow:
    element: SweepElement
    row: RunRow

    def to_json(self) -> dict[str, object]:
        return {"index": self.element.index, "overrides": dict(self.element.overrides), **self.row.to_json()}


def best_first(rows: list[ElementRow]) -> list[ElementRow]:
    """Lowest last loss first; elements without a loss yet after them, by index."""
    return sorted(rows, key=lambda r: (r.row.summary.loss is None, r.row.summary.loss or 0.0, r.element.index))


def sweep_rows(record: SweepRecord, client: SlurmClient) -> list[ElementRow]:
    return best_first([ElementRow(e, runs_row(RunDir(e.run_dir), client)) for e in record.elements])


def cancel_sweep(record: SweepRecord, client: SlurmClient) -> list[tuple[SweepElement, CancelOutcome | str]]:
    """Cancel every element's job (an element never submitted, or already ended, is said so); per element."""
    outcomes: list[tuple[SweepElement, CancelOutcome | str]] = []
    for element in record.elements:
        try:
            outcomes.append((element, cancel_run(RunDir(element.run_dir), client)))
        except UserError as exc:
            outcomes.append((element, str(exc)))
    return outcomes


def wait_sweep(
    record: SweepRecord, client: SlurmClient, *, timeout_s: float, say: Callable[[str], None], poll_s: float = 3.0
) -> dict[int, str]:
    """Follow every element to its job's end, saying each change of state; the final state of each element."""
    seen: dict[int, str] = {}

    def poll() -> dict[int, tuple[str, bool]]:
        states = {}
        for element in record.elements:
            status = run_status(RunDir(element.run_dir), client)
            states[element.index] = (str(status.job.state), status.job.state.terminal)
        return states

    def report(states: dict[int, tuple[str, bool]]) -> bool:
        for index, (state, _) in states.items():
            if seen.get(index) != state:
                say(f"element {index}: {state}")
                seen[index] = state
        return all(done for _, done in states.values())

    for _ in poll_until(poll, report, timeout_s=timeout_s, poll_s=poll_s, what=lambda s: f"{len(s)} elements"):
        pass
    return seen
