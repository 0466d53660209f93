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


@dataclass(frozen=True)
class JobFacts:
    """What one job (all its runs) did inside the window."""

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


def _held(row: AccountingRow, window: Window) -> tuple[float, float]:
    """(seconds held in the window, seconds held in all) of one run."""
    if row.start_s is None:
        return 0.0, 0.0
    end = row.end_s if row.end_s is not None else row.start_s + row.elapsed_s  # running: held so far
    return window.overlap(row.start_s, end), float(max(end - row.start_s, 0))


def _waited_until(row: AccountingRow, window: Window) -> float:
    """The end of a run's wait: its start, its end when it ended without starting (cancelled), else still waiting."""
    if row.start_s is not None:
        return row.start_s
    return row.end_s if row.end_s is not None and row.state.terminal else window.until_s


def job_facts(runs: list[AccountingRow], window: Window) -> JobFacts:
    """The facts of one job from its rows (oldest first). Pure."""
    first, last = runs[0], runs[-1]
    nodes = max(r.nodes for r in runs)
    node_s = gpu_s = held = held_total = queue = gap = gap_total = 0.0
    requeues = 0
    requeue_waits: list[float] = []
    preempted: set[int] = set()
    failures: list[tuple[int, str]] = []
    for index, row in enumerate(runs):
        in_window, total = _held(row, window)
        held += in_window
        held_total += total
        node_s += in_window * row.nodes
        gpu_s += in_window * row.gpus
        waited = window.overlap(row.submit_s, _waited_until(row, window))
        if index == 0:
            queue += waited
        else:
            gap += waited
            gap_total += _waited_until(row, window) - row.submit_s
            requeues += window.since_s <= row.submit_s < window.until_s
            if row.start_s is not None and window.since_s <= row.start_s < window.until_s:
                requeue_waits.append(float(row.start_s - row.submit_s))
        ended_in_window = row.end_s is not None and window.since_s <= row.end_s < window.until_s
        if row.state is JobState.PREEMPTED and ended_in_window:
            preempted.add(index)
        kind = STATE_FAILURE.get(row.state)
        if kind is not None and ended_in_window:
            failures.append((index, kind))
    started = first.start_s
    queue_wait = (
        float(started - first.submit_s) if started is not None and window.since_s <= started < window.until_s else None
    )
    ended = last.end_s if last.end_s is not None and last.state.terminal else window.until_s
    return JobFacts(
        job_id=first.job_id,
        display_id=first.display_id,
        account=first.account,
        qos=first.qos,
        user=first.user,
        name=first.name,
        nodes=nodes,
        runs=tuple(runs),
        node_s=node_s,
        gpu_s=gpu_s,
        held_s=held,
        held_total_s=held_total,
        wanted_node_s=window.overlap(first.submit_s, ended) * nodes,
        queue_wait_s=queue_wait,
        requeue_waits_s=tuple(requeue_waits),
        queue_s=queue,
        restart_gap_s=gap,
        restart_gap_total_s=gap_total,
        requeues=requeues,
        preempted_runs=frozenset(preempted),
        failures=tuple(failures),
        pending=last.start_s is None and not last.state.terminal,
    )


def run_index_at(runs: tuple[AccountingRow, ...], time_s: float, slack_s: float = 2.0) -> int | None:
    """The run of a job that was holding its allocation (or ending) at ``time_s``; None before the first start."""
    found = None
    for index, row in enumerate(runs):
        if row.start_s is not None and row.start_s - slack_s <= time_s:
            found = index
    return found
