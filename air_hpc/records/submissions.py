"""Which jobs carried a run (submissions.jsonl): attempts, submissions, starts, rank exits, cancels.

``submit`` appends one ``submitting`` line before sbatch runs and one ``submitted``
line per submission; the batch script appends one ``started`` line per start, so
requeues show up as further starts of the same job id. Lines follow the shared
schema of ``records.jsonl``.
"""

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from air_hpc.errors import UserError
from air_hpc.records.jsonl import append, read_jsonl, record
from air_hpc.records.names import KIND
from air_hpc.records.rundir import RunDir

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
    cluster: str | None = None
    """The Slurm cluster that holds the job (``submit --clusters``); None: the default cluster (SLURM_CONF's)."""


def _append(run_dir: RunDir, kind: str, time_s: float | None = None, **fields: object) -> None:
    append(run_dir.submissions, record(kind, time.time() if time_s is None else time_s, **fields))


def record_submission(
    run_dir: RunDir,
    job_id: str,
    executor: Executor,
    now_s: float | None = None,
    pid_started_s: float | None = None,
    token: str | None = None,
    cluster: str | None = None,
) -> None:
    """One ``submitted`` line; a local job's controller also by its start time, an sbatch by its attempt's token,
    a job on another Slurm cluster by that cluster's name."""
    fields: dict[str, object] = {"job_id": job_id, "executor": executor}
    if cluster is not None:
        fields["cluster"] = cluster
    if pid_started_s is not None:
        fields["pid_started_s"] = pid_started_s
    if token is not None:
        fields["token"] = token
    _append(run_dir, "submitted", now_s or time.time(), **fields)


@dataclass(frozen=True)
class Attempt:
    """An ``sbatch`` recorded before it ran: its job name and the unique ``--comment`` token find it in Slurm."""

    token: str
    job_name: str
    executor: Executor
    time_s: float
    cluster: str | None = None
    """The Slurm cluster the sbatch went to (``-M``); None: the default cluster."""


def record_attempt(run_dir: RunDir, attempt: Attempt) -> None:
    """Written before sbatch runs, so a submit whose answer was lost can still be found and managed."""
    where = {} if attempt.cluster is None else {"cluster": attempt.cluster}
    _append(
        run_dir,
        "submitting",
        attempt.time_s,
        token=attempt.token,
        job_name=attempt.job_name,
        executor=attempt.executor,
        **where,
    )


def record_not_submitted(run_dir: RunDir, token: str) -> None:
    """Slurm was asked and knows no job with this attempt's token: it never reached the queue."""
    _append(run_dir, "not_submitted", token=token)


def pending_attempts(run_dir: RunDir) -> list[Attempt]:
    """Attempts with no outcome yet (neither a ``submitted`` nor a ``not_submitted`` line with their token)."""
    rows = read_jsonl(run_dir.submissions)
    settled = {r.get("token") for r in rows if r.get(KIND) in ("submitted", "not_submitted")}
    pending = []
    for row in rows:
        token, executor, name = row.get("token"), row.get("executor"), row.get("job_name")
        if row.get(KIND) != "submitting" or not isinstance(token, str) or token in settled:
            continue
        if executor in EXECUTORS and isinstance(name, str):
            cluster = row.get("cluster")
            where = cluster if isinstance(cluster, str) else None
            pending.append(Attempt(token, name, executor, _number(row.get("time"), float) or 0.0, where))
    return pending


def record_exit(run_dir: RunDir, job_id: str, rank: int, exit_code: int) -> None:
    """A rank of a local job says how it ended (the controller's own result is a pickle we never read)."""
    _append(run_dir, "ended", job_id=job_id, rank=rank, exit_code=int(exit_code))


def record_cancel(run_dir: RunDir, job_id: str) -> None:
    _append(run_dir, "cancelled", job_id=job_id)


def _number(value: object, kind: type[int] | type[float]) -> int | float | None:
    """A JSON number from a run file, else None (the file is data, not to be trusted)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return kind(value) if math.isfinite(value) else None


def submissions(run_dir: RunDir) -> list[SubmissionRecord]:
    rows = read_jsonl(run_dir.submissions)
    records = []
    for row in rows:
        if row.get(KIND) != "submitted":
            continue
        job_id = str(row.get("job_id"))
        executor = row.get("executor")
        if executor not in EXECUTORS:
            continue
        mine = [r for r in rows if str(r.get("job_id")) == job_id]
        exits: dict[int, int] = {}
        for r in mine:
            rank, code = _number(r.get("rank"), int), _number(r.get("exit_code"), int)
            if r.get(KIND) == "ended" and rank is not None and code is not None:
                exits[int(rank)] = int(code)
        pid = int(job_id) if executor == "local" and job_id.isascii() and job_id.isdigit() else None
        records.append(
            SubmissionRecord(
                job_id,
                executor,
                _number(row.get("time"), float) or 0.0,
                sum(1 for r in mine if r.get(KIND) == "started"),
                pid=pid,
                pid_started_s=_number(row.get("pid_started_s"), float) if pid is not None else None,
                exits=exits,
                cancelled=any(r.get(KIND) == "cancelled" for r in mine),
                cluster=row["cluster"] if isinstance(row.get("cluster"), str) else None,
            )
        )
    return records


def latest_submission(run_dir: RunDir) -> SubmissionRecord:
    records = submissions(run_dir)
    if not records:
        raise UserError(f"{run_dir.submissions}: no submission recorded; submit the run with `air-hpc submit` first")
    return records[-1]


def record_start(run_dir: RunDir, job_id: str, restart_count: int, nodelist: str) -> None:
    """The batch script's ``started`` line: one per start of the job (the first, then each requeue)."""
    _append(run_dir, "started", int(time.time()), job_id=job_id, restart_count=restart_count, nodelist=nodelist)


def started_time(path: Path, job_id: str | None) -> float | None:
    """Time of the newest ``started`` line for ``job_id`` (any job id when None) in a submissions file."""
    for entry in reversed(read_jsonl(path)):
        if entry.get(KIND) == "started" and (job_id is None or str(entry.get("job_id")) == job_id):
            try:
                return float(entry["time"])
            except (KeyError, TypeError, ValueError):
                return None
    return None
