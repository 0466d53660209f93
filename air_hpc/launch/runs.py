"""A run's records: which jobs carried it (submissions.jsonl) and how far it got (metrics.jsonl).

``submit`` appends one ``submitted`` line per submission; the batch script
appends one ``started`` line per start, so requeues show up as further starts
of the same job id.
"""

import difflib
import json
import logging
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from air_hpc.errors import UserError
from air_hpc.rundir import RunDir, read_jsonl

log = logging.getLogger(__name__)

Executor = Literal["slurm", "submitit", "local"]
EXECUTORS: tuple[Executor, ...] = ("slurm", "submitit", "local")


@dataclass(frozen=True)
class SubmissionRecord:
    job_id: str
    executor: Executor
    time_s: float
    starts: int
    """Starts of this job recorded by the batch script (1 + requeues); 0 before it first runs."""
    pid: int | None = None
    """Local executor: the controller's PID (the job id) ..."""
    pid_started_s: float | None = None
    """... and its start time, which proves a live PID is still that process."""
    exits: Mapping[int, int] = field(default_factory=dict)
    """Local executor: each rank's last recorded exit code."""
    cancelled: bool = False
    """``air-hpc cancel`` stopped this job."""


def _append(run_dir: RunDir, line: dict[str, object]) -> None:
    run_dir.path.mkdir(parents=True, exist_ok=True)
    with run_dir.submissions.open("a") as out:
        out.write(json.dumps(line, sort_keys=True) + "\n")


def record_submission(
    run_dir: RunDir,
    job_id: str,
    executor: Executor,
    now_s: float | None = None,
    pid_started_s: float | None = None,
    token: str | None = None,
) -> None:
    """One ``submitted`` line; a local job's controller also by its start time, an sbatch by its attempt's token."""
    line: dict[str, object] = {
        "event": "submitted",
        "job_id": job_id,
        "executor": executor,
        "time": now_s or time.time(),
    }
    if pid_started_s is not None:
        line["pid_started_s"] = pid_started_s
    if token is not None:
        line["token"] = token
    _append(run_dir, line)


@dataclass(frozen=True)
class Attempt:
    """An ``sbatch`` recorded before it ran: its job name and the unique ``--comment`` token find it in Slurm."""

    token: str
    job_name: str
    executor: Executor
    time_s: float


def record_attempt(run_dir: RunDir, attempt: Attempt) -> None:
    """Written before sbatch runs, so a submit whose answer was lost can still be found and managed."""
    _append(
        run_dir,
        {
            "event": "submitting",
            "token": attempt.token,
            "job_name": attempt.job_name,
            "executor": attempt.executor,
            "time": attempt.time_s,
        },
    )


def record_not_submitted(run_dir: RunDir, token: str) -> None:
    """Slurm was asked and knows no job with this attempt's token: it never reached the queue."""
    _append(run_dir, {"event": "not_submitted", "token": token, "time": time.time()})


def pending_attempts(run_dir: RunDir) -> list[Attempt]:
    """Attempts with no outcome yet (neither a ``submitted`` nor a ``not_submitted`` line with their token)."""
    rows = read_jsonl(run_dir.submissions)
    settled = {r.get("token") for r in rows if r.get("event") in ("submitted", "not_submitted")}
    pending = []
    for row in rows:
        token, executor, name = row.get("token"), row.get("executor"), row.get("job_name")
        if row.get("event") != "submitting" or not isinstance(token, str) or token in settled:
            continue
        if executor in EXECUTORS and isinstance(name, str):
            pending.append(Attempt(token, name, executor, _number(row.get("time"), float) or 0.0))
    return pending


def record_exit(run_dir: RunDir, job_id: str, rank: int, exit_code: int) -> None:
    """A rank of a local job says how it ended (the controller's own result is a pickle we never read)."""
    _append(
        run_dir, {"event": "ended", "job_id": job_id, "rank": rank, "exit_code": int(exit_code), "time": time.time()}
    )


def record_cancel(run_dir: RunDir, job_id: str) -> None:
    _append(run_dir, {"event": "cancelled", "job_id": job_id, "time": time.time()})


def _number(value: object, kind: type[int] | type[float]) -> int | float | None:
    """A JSON number from a run file, else None (the file is data, not to be trusted)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return kind(value) if math.isfinite(value) else None


def submissions(run_dir: RunDir) -> list[SubmissionRecord]:
    rows = read_jsonl(run_dir.submissions)
    records = []
    for row in rows:
        if row.get("event") != "submitted":
            continue
        job_id = str(row.get("job_id"))
        executor = row.get("executor")
        if executor not in EXECUTORS:
            continue
        mine = [r for r in rows if str(r.get("job_id")) == job_id]
        exits: dict[int, int] = {}
        for r in mine:
            rank, code = _number(r.get("rank"), int), _number(r.get("exit_code"), int)
            if r.get("event") == "ended" and rank is not None and code is not None:
                exits[int(rank)] = int(code)
        pid = int(job_id) if executor == "local" and job_id.isascii() and job_id.isdigit() else None
        records.append(
            SubmissionRecord(
                job_id,
                executor,
                _number(row.get("time"), float) or 0.0,
                sum(1 for r in mine if r.get("event") == "started"),
                pid=pid,
                pid_started_s=_number(row.get("pid_started_s"), float) if pid is not None else None,
                exits=exits,
                cancelled=any(r.get("event") == "cancelled" for r in mine),
            )
        )
    return records


def latest_submission(run_dir: RunDir) -> SubmissionRecord:
    records = submissions(run_dir)
    if not records:
        raise UserError(f"{run_dir.submissions}: no submission recorded; submit the run with `air-hpc submit` first")
    return records[-1]


#: Where run names are looked up (``air-hpc status NAME``); default ``./runs``.
RUNS_ROOT_ENV = "AIR_HPC_RUNS_ROOT"


def runs_root(root: Path | str | None = None) -> Path:
    """The directory holding run directories: ``root``, else $AIR_HPC_RUNS_ROOT, else ./runs."""
    chosen = root if root is not None else os.environ.get(RUNS_ROOT_ENV) or "runs"
    return Path(chosen).expanduser().resolve()


def is_run_dir(path: Path) -> bool:
    """A directory air-hpc made for a run: it holds the resolved job, the submissions or checkpoints."""
    run_dir = RunDir(path)
    return run_dir.job_json.is_file() or run_dir.submissions.is_file() or run_dir.checkpoints.is_dir()


def find_runs(root: Path | str | None = None) -> list[RunDir]:
    """The run directories directly under the runs root, by name."""
    base = runs_root(root)
    if not base.is_dir():
        return []
    return [RunDir(p) for p in sorted(base.iterdir()) if p.is_dir() and is_run_dir(p)]


def resolve_run(target: str, root: Path | str | None = None) -> RunDir:
    """The one way every command finds a run: a run directory, a run name under the runs root, or a job file.

    A job file names its run (``run.root``/``run.name``), so the file a run was
    submitted with finds it again.
    """
    path = Path(target).expanduser()
    if path.is_file():
        from air_hpc.config import load_job

        return RunDir.of(load_job(path))
    if path.is_dir():
        if is_run_dir(path):
            return RunDir(path.resolve())
        raise UserError(
            f"{target}: not a run directory (no job.json, submissions.jsonl or checkpoints/); give a run directory, "
            "a run name or a job file"
        )
    base = runs_root(root)
    if path.name == target and is_run_dir(base / target):
        return RunDir(base / target)
    names = [r.path.name for r in find_runs(base)]
    close = difflib.get_close_matches(target, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise UserError(
        f"{target}: no such run: not a run directory, a job file, or a run name under {base}{hint} "
        f"(`air-hpc runs --root DIR` lists them; ${RUNS_ROOT_ENV} sets the root)"
    )
