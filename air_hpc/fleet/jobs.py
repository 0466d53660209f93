"""One job's allocations as facts for the fleet report: held node- and GPU-seconds, waits, preemptions, failures.

Pure: sacct's rows of a window in, :class:`JobFacts` out. Time is clipped to the
window the way ``sreport`` clips usage, so a job that runs across two weekly
windows is split between them. A job's runs are its rows in submission order:
the first waits from submission to start (the queue), each later one from its
requeue to its restart.
"""

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from air_hpc.slurm.accounting import AccountingRow
from air_hpc.slurm.jobs import JobState

FAILURE_KINDS = ("infrastructure", "application", "user")

#: How a run's end state types a failure: the platform's, the program's, or the user's own doing.
STATE_FAILURE: dict[JobState, str] = {
    JobState.NODE_FAIL: "infrastructure",
    JobState.BOOT_FAIL: "infrastructure",
    JobState.FAILED: "application",
    JobState.OUT_OF_MEMORY: "application",
    JobState.CANCELLED: "user",
    JobState.TIMEOUT: "user",
    JobState.DEADLINE: "user",
}


@dataclass(frozen=True)
class Window:
    """``[since_s, until_s)`` in epoch seconds."""

    since_s: float
    until_s: float

    @property
    def days(self) -> float:
        return max(self.until_s - self.since_s, 0.0) / 86400.0

    def overlap(self, begin: float, end: float) -> float:
        return max(min(end, self.until_s) - max(begin, self.since_s), 0.0)


class JobFacts(NamedTuple):
    """What one job (all its runs) did inside the window (a tuple: there may be a hundred thousand)."""

    job_id: str
    display_id: str
    account: str
    qos: str
    user: str
    name: str
    nodes: int
    runs: tuple[AccountingRow, ...]
    """Its rows, oldest first."""
    node_s: float
    gpu_s: float
    held_s: float
    """Seconds it held its allocation in the window (all runs)."""
    held_total_s: float
    """Seconds it held its allocation in all (unclipped), to share a run's own records out over windows."""
    wanted_node_s: float
    """Node-seconds it wanted in the window: from submission to its last end (or the window's end), all its nodes."""
    queue_wait_s: float | None
    """Submission to first start, when the first start lies in the window."""
    requeue_waits_s: tuple[float, ...]
    """Requeue to restart of each later run that restarted in the window."""
    queue_s: float
    """Waiting for the first start inside the window (a job still pending counts up to the window's end)."""
    restart_gap_s: float
    """Waiting for restarts inside the window."""
    restart_gap_total_s: float
    """Waiting for restarts in all (unclipped), to tell a run's restart latency apart from its wait."""
    requeues: int
    """Runs after the first whose requeue lies in the window."""
    preempted_runs: frozenset[int]
    """Indexes of the runs Slurm ended as PREEMPTED."""
    failures: tuple[tuple[int, str], ...]
    """(run index, kind) of each run that ended in a failure, by its state."""
    pending: bool
    """Still waiting at the window's end."""


def group_jobs(rows: Iterable[AccountingRow]) -> dict[str, list[AccountingRow]]:
    """Rows by job id, each job's in submission order (sacct interleaves the runs of different jobs)."""
    jobs: dict[str, list[AccountingRow]] = defaultdict(list)
    for row in rows:
        jobs[row.job_id].append(row)
    for runs in jobs.values():
        if len(runs) > 1:
            runs.sort(key=lambda r: r.submit_s)
    return jobs


class _Sums(NamedTuple):
    node_s: float
    gpu_s: float
    held_s: float
    held_total_s: float
    queue_s: float
    gap_s: float
    gap_total_s: float
    requeues: int
    requeue_waits_s: tuple[float, ...]


def _sums(runs: list[AccountingRow], since: float, until: float) -> _Sums:
    """Held time (in the window and in all), waits and requeues over a job's runs; written for speed."""
    node_s = gpu_s = held = held_total = queue = gap = gap_total = 0.0
    requeues = 0
    waits: list[float] = []
    for index, row in enumerate(runs):
        start, end, submit = row.start_s, row.end_s, row.submit_s
        if start is not None:
            stop = end if end is not None else start + row.elapsed_s  # running: held so far
            in_window = max(min(stop, until) - max(start, since), 0.0)
            held += in_window
            held_total += max(stop - start, 0)
            node_s += in_window * row.nodes
            gpu_s += in_window * row.gpus
            waited_until: float = start
        else:  # never started: it waited until it ended (cancelled), or still waits
            waited_until = end if end is not None and row.state.terminal else until
        waited = max(min(waited_until, until) - max(submit, since), 0.0)
        if index == 0:
            queue += waited
            continue
        gap += waited
        gap_total += waited_until - submit
        requeues += since <= submit < until
        if start is not None and since <= start < until:
            waits.append(float(start - submit))
    return _Sums(node_s, gpu_s, held, held_total, queue, gap, gap_total, requeues, tuple(waits))


def _ends(runs: list[AccountingRow], since: float, until: float) -> tuple[frozenset[int], tuple[tuple[int, str], ...]]:
    """(runs preempted, (run, failure kind) of runs that failed), of the runs that ended inside the window."""
    preempted = []
    failures = []
    for index, row in enumerate(runs):
        end = row.end_s
        if end is None or not since <= end < until:
            continue
        if row.state is JobState.PREEMPTED:
            preempted.append(index)
        kind = STATE_FAILURE.get(row.state)
        if kind is not None:
            failures.append((index, kind))
    return frozenset(preempted), tuple(failures)


def job_facts(runs: list[AccountingRow], window: Window) -> JobFacts:
    """The facts of one job from its rows (oldest first). Pure."""
    since, until = window.since_s, window.until_s
    first, last = runs[0], runs[-1]
    nodes = max(r.nodes for r in runs) if len(runs) > 1 else first.nodes
    sums = _sums(runs, since, until)
    preempted, failures = _ends(runs, since, until)
    started = first.start_s
    queue_wait = float(started - first.submit_s) if started is not None and since <= started < until else None
    ended = last.end_s if last.end_s is not None and last.state.terminal else until
    return JobFacts(
        job_id=first.job_id,
        display_id=first.display_id,
        account=first.account,
        qos=first.qos,
        user=first.user,
        name=first.name,
        nodes=nodes,
        runs=tuple(runs),
        node_s=sums.node_s,
        gpu_s=sums.gpu_s,
        held_s=sums.held_s,
        held_total_s=sums.held_total_s,
        wanted_node_s=max(min(ended, until) - max(first.submit_s, since), 0.0) * nodes,
        queue_wait_s=queue_wait,
        requeue_waits_s=sums.requeue_waits_s,
        queue_s=sums.queue_s,
        restart_gap_s=sums.gap_s,
        restart_gap_total_s=sums.gap_total_s,
        requeues=sums.requeues,
        preempted_runs=preempted,
        failures=failures,
        pending=last.start_s is None and not last.state.terminal,
    )


def run_index_at(runs: tuple[AccountingRow, ...], time_s: float, slack_s: float = 2.0) -> int | None:
    """The run of a job that was holding its allocation (or ending) at ``time_s``; None before the first start."""
    found = None
    for index, row in enumerate(runs):
        if row.start_s is not None and row.start_s - slack_s <= time_s:
            found = index
    return found
