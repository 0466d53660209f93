"""A run's records: which jobs carried it (submissions.jsonl) and how far it got (metrics.jsonl).

``submit`` appends one ``submitted`` line per submission; the batch script
appends one ``started`` line per start, so requeues show up as further starts
of the same job id.
"""

import json
import logging
import time
from dataclasses import dataclass
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


def record_submission(run_dir: RunDir, job_id: str, executor: Executor, now_s: float | None = None) -> None:
    line = {"event": "submitted", "job_id": job_id, "executor": executor, "time": now_s or time.time()}
    run_dir.path.mkdir(parents=True, exist_ok=True)
    with run_dir.submissions.open("a") as out:
        out.write(json.dumps(line, sort_keys=True) + "\n")


def submissions(run_dir: RunDir) -> list[SubmissionRecord]:
    rows = read_jsonl(run_dir.submissions)
    records = []
    for row in rows:
        if row.get("event") != "submitted":
            continue
        job_id = str(row.get("job_id"))
        starts = sum(1 for r in rows if r.get("event") == "started" and str(r.get("job_id")) == job_id)
        executor = row.get("executor")
        if executor not in EXECUTORS:
            continue
        records.append(SubmissionRecord(job_id, executor, float(row.get("time", 0.0)), starts))
    return records


def latest_submission(run_dir: RunDir) -> SubmissionRecord:
    records = submissions(run_dir)
    if not records:
        raise UserError(f"{run_dir.submissions}: no submission recorded; submit the run with `air-hpc submit` first")
    return records[-1]


def resolve_run(target: str) -> RunDir:
    """A run directory given by path (absolute, or relative to the current directory)."""
    path = Path(target).expanduser()
    run_dir = RunDir(path.resolve())
    if not run_dir.job_json.is_file() and not run_dir.submissions.is_file():
        raise UserError(f"{target}: not a run directory (no job.json or submissions.jsonl); give the path of a run")
    return run_dir
