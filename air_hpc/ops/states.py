"""Every run under a root with its job state, for exporters that look at the whole fleet on every scrape.

Slurm jobs (our script's and submitit's) take one ``squeue`` and one ``sacct``
call for all runs together. A local run is RUNNING while its controller process
lives; afterwards its files tell (COMPLETED when every step was trained).
Nothing here unpickles a run's files (submitit's result pickles are left alone),
and a controller that does not answer makes the states UNKNOWN, not an error.
"""

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from air_hpc.digits import ascii_int
from air_hpc.errors import AirHpcError, SlurmError
from air_hpc.observe.prometheus import RunMetrics, run_metrics
from air_hpc.observe.records import RunRecords, load_records
from air_hpc.observe.summary import blank_summary
from air_hpc.ops.runs import find_runs
from air_hpc.ownership.clusters import run_client
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import SubmissionRecord, submissions
from air_hpc.slurm.client import SlurmClient
from air_hpc.slurm.jobs import JobRecord, JobState, merge_status

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunJob:
    submission: SubmissionRecord | None
    """The latest submission; None before the run was submitted."""
    state: JobState | None
    """None before the run was submitted."""
    restarts: int


def trained_every_step(records: RunRecords) -> bool:
    """The run's own records show its last step trained: it completed, whatever the scheduler still remembers."""
    return records.total_steps is not None and any(s.step >= records.total_steps for s in records.steps)


def _local_state(submission: SubmissionRecord, records: RunRecords) -> JobState:
    pid = ascii_int(submission.job_id)
    if pid is not None and psutil.pid_exists(pid):
        return JobState.RUNNING
    return JobState.COMPLETED if trained_every_step(records) else JobState.UNKNOWN


def _ask_slurm(job_ids: list[str], client: SlurmClient) -> tuple[list[JobRecord], list[JobRecord], bool]:
    """The queue's and accounting's records of the jobs, and whether the queue answered.

    A dead slurmdbd costs only the ended jobs' accounting: the queue still tells the live ones.
    """
    if not job_ids:
        return [], [], True
    try:
        queued = client.squeue(job_ids)
    except SlurmError as exc:
        log.warning("job states unknown: %s", exc)
        return [], [], False
    gone = sorted(set(job_ids) - {r.job_id for r in queued})
    try:
        return queued, client.sacct(gone) if gone else [], True
    except SlurmError as exc:
        log.warning("ended jobs' states from the runs' records only: %s", exc)
        return queued, [], True


Answer = tuple[list[JobRecord], list[JobRecord], bool]


def _ask_each_cluster(
    runs: list[tuple[RunDir, RunRecords]], latest: list[SubmissionRecord | None], client: SlurmClient
) -> dict[str | None, Answer]:
    """:func:`_ask_slurm` once per cluster holding some of the jobs (``submit --clusters``; None: the default one)."""
    by_cluster: dict[str | None, list[tuple[RunDir, SubmissionRecord]]] = {}
    for (run_dir, _), submission in zip(runs, latest, strict=True):
        if submission is not None and submission.executor != "local":
            by_cluster.setdefault(submission.cluster, []).append((run_dir, submission))
    answers: dict[str | None, Answer] = {}
    for cluster, jobs in by_cluster.items():
        answers[cluster] = _ask_slurm([s.job_id for _, s in jobs], run_client(jobs[0][0], client, jobs[0][1]))
    return answers


def run_jobs(runs: list[tuple[RunDir, RunRecords]], client: SlurmClient) -> list[RunJob]:
    """The latest job of each run and its state, in the order given.

    A job the scheduler cannot tell about (accounting down or forgotten, the controller down) is
    COMPLETED when its run's records show every step trained, else UNKNOWN.
    """
    latest: list[SubmissionRecord | None] = [next(reversed(submissions(run_dir)), None) for run_dir, _ in runs]
    answers = _ask_each_cluster(runs, latest, client)
    found = []
    for (_, records), submission in zip(runs, latest, strict=True):
        if submission is None:
            found.append(RunJob(None, None, 0))
            continue
        recorded_restarts = max(submission.starts - 1, 0)
        if submission.executor == "local":
            found.append(RunJob(submission, _local_state(submission, records), recorded_restarts))
            continue
        queued, accounted, reachable = answers[submission.cluster]
        status = merge_status(submission.job_id, queued, accounted) if reachable else None
        state = status.state if status else JobState.COMPLETED if trained_every_step(records) else JobState.UNKNOWN
        restarts = max(status.restarts if status else 0, recorded_restarts)
        found.append(RunJob(submission, state, restarts))
    return found


def _readable(run_dirs: list[RunDir]) -> tuple[list[tuple[RunDir, RunRecords]], dict[RunDir, str]]:
    """Each run's records, and why for each run whose own files cannot be read (one bad run hides no other)."""
    readable, problems = [], {}
    for run_dir in run_dirs:
        try:
            readable.append((run_dir, load_records(run_dir)))
        except AirHpcError as exc:
            log.warning("run %s is unreadable: %s", run_dir.path, exc)
            problems[run_dir] = str(exc)
    return readable, problems


def snapshot(root: Path | str | None, client: SlurmClient) -> list[RunMetrics]:
    """The numbers of every run under ``root`` now (see :func:`~air_hpc.ops.runs.find_runs`), by name.

    A run whose files cannot be read is there too, state ``unreadable``, with why.
    """
    run_dirs = find_runs(root)
    runs, problems = _readable(run_dirs)
    now = time.time()
    found = {
        run_dir: run_metrics(
            run_dir,
            records,
            job.state,
            job.submission.job_id if job.submission else None,
            job.submission.executor if job.submission else None,
            job.restarts,
            now,
        )
        for (run_dir, records), job in zip(runs, run_jobs(runs, client), strict=True)
    }
    for run_dir, problem in problems.items():
        found[run_dir] = RunMetrics(blank_summary(run_dir), None, None, None, None, problem)
    return [found[run_dir] for run_dir in run_dirs]
