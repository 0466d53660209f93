"""The fleet report: per tenant (account) and per QOS, what the cluster gave, what it cost, and what was lost.

Pure: sacct's rows, the run records of our jobs and the prices in; a
:class:`FleetReport` out. Goodput is decomposed the way Google's ML goodput is:

- scheduling goodput: node-seconds holding an allocation / node-seconds wanted
  (from submission to the job's end), every job;
- runtime goodput: productive step time / time holding the allocation, node-weighted,
  over the jobs whose run records we have (ours);
- program goodput: MFU, weighted by productive node-seconds, where the hardware's
  peak is known (GPU runs);
- overall: the product of those known.

Badput is in seconds of job time: waiting in the queue and for restarts
(sacct, every job), and start-up, checkpoint stall and work lost and redone
(the run records, ours only). A run's own numbers cover its whole history; a job
gets the share of them that its time held inside the window is of the run's.
"""

import bisect
import heapq
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from air_hpc.fleet.jobs import FAILURE_KINDS, JobFacts, Window, group_jobs, job_facts
from air_hpc.fleet.runs import RunFacts
from air_hpc.slurm.accounting import Accounting

BADPUT_KINDS = ("queue", "startup", "checkpoint_stall", "lost_work", "restart_gap")
#: Jobs listed as the worst by badput, in the fleet and in each tenant or QOS.
WORST_JOBS = 10
WORST_PER_GROUP = 3


@dataclass(frozen=True)
class Prices:
    """What an hour costs; GPU-hours price a job that holds GPUs, node-hours any other (None: no price)."""

    usd_per_node_hour: float | None = None
    usd_per_gpu_hour: float | None = None

    def cost(self, node_s: float, gpu_s: float) -> float | None:
        if gpu_s > 0 and self.usd_per_gpu_hour is not None:
            return gpu_s / 3600.0 * self.usd_per_gpu_hour
        if self.usd_per_node_hour is not None:
            return node_s / 3600.0 * self.usd_per_node_hour
        return None


class JobOutcome(NamedTuple):
    """A job's facts from sacct, with what its run's records add (ours) and what it cost."""

    facts: JobFacts
    run_name: str | None
    preemptions: int
    failures: Mapping[str, int]
    badput_s: Mapping[str, float]
    productive_s: float | None
    """Productive step time in the window (None: not ours, or its records are unreadable)."""
    mfu: float | None
    cost_usd: float | None

    @property
    def badput_total_s(self) -> float:
        return sum(self.badput_s.values())


@dataclass(frozen=True)
class Quantiles:
    p50: float | None
    p95: float | None
    max: float | None
    count: int

    @classmethod
    def of(cls, values: Sequence[float]) -> "Quantiles":
        ordered = sorted(values)
        return cls(
            nearest_rank(ordered, 0.50), nearest_rank(ordered, 0.95), ordered[-1] if ordered else None, len(ordered)
        )

    def to_json(self) -> dict[str, float | None]:
        return {"p50": self.p50, "p95": self.p95, "max": self.max}


def nearest_rank(ordered: Sequence[float], q: float) -> float | None:
    """The q-quantile of sorted values by the nearest-rank method (a value that occurred, never interpolated)."""
    if not ordered:
        return None
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


@dataclass(frozen=True)
class GroupReport:
    """One tenant's (or QOS's) jobs in the window."""

    key: str
    jobs: int
    node_seconds: float
    gpu_seconds: float
    queue_wait_s: Quantiles
    requeue_wait_s: Quantiles
    pending: int
    preemptions: int
    requeues: int
    failures: Mapping[str, int]
    goodput: Mapping[str, float | None]
    badput_s: Mapping[str, float]
    cost_usd: float | None
    jobs_with_records: int
    productive_s: float = 0.0
    """Productive step time of our jobs in the window (job-seconds, like the badput)."""
    queue_waits_s: tuple[float, ...] = field(default=(), repr=False)
    """Every first wait, for SLO attainment."""
    requeue_waits_s: tuple[float, ...] = field(default=(), repr=False)
    worst: tuple["WorstJob", ...] = ()
    """Its jobs that lost the most time, worst first."""

    @classmethod
    def empty(cls, key: str) -> "GroupReport":
        """A tenant or QOS without jobs in the window."""
        return group(key, ())

    def to_json(self, label: str) -> dict[str, Any]:
        return {
            label: self.key,
            "jobs": self.jobs,
            "node_seconds": self.node_seconds,
            "gpu_seconds": self.gpu_seconds,
            "queue_wait_s": self.queue_wait_s.to_json(),
            "requeue_wait_s": self.requeue_wait_s.to_json(),
            "pending": self.pending,
            "preemptions": self.preemptions,
            "requeues": self.requeues,
            "failures": dict(self.failures),
            "goodput": dict(self.goodput),
            "badput_s": dict(self.badput_s),
            "cost_usd": self.cost_usd,
            "jobs_with_records": self.jobs_with_records,
            "productive_s": self.productive_s,
        }


@dataclass(frozen=True)
class WorstJob:
    job_id: str
    account: str
    qos: str
    name: str
    """The run's name when the job is ours, else Slurm's job name."""
    ours: bool
    badput_s: Mapping[str, float]

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "account": self.account,
            "qos": self.qos,
            "name": self.name,
            "ours": self.ours,
            "badput_s": dict(self.badput_s),
            "badput_total_s": sum(self.badput_s.values()),
        }


@dataclass(frozen=True)
class FleetReport:
    window: Window
    tenants: tuple[GroupReport, ...]
    qos: tuple[GroupReport, ...]
    total: GroupReport
    worst: tuple[WorstJob, ...]
    rows: int
    malformed: int
    malformed_examples: tuple[str, ...]
    runs_seen: int
    """Run directories looked at for our jobs."""
    prices: Prices = Prices()

    @property
    def priced(self) -> bool:
        return self.prices.usd_per_node_hour is not None or self.prices.usd_per_gpu_hour is not None

    @property
    def empty(self) -> bool:
        return self.total.jobs == 0


def _event_runs(facts: Sequence[JobFacts]) -> tuple[list[float], list[tuple[int, int]]]:
    """Starts of every run of a run directory's jobs, sorted, with (job position, run index) of each."""
    starts = sorted(
        (row.start_s, position, index)
        for position, job in enumerate(facts)
        for index, row in enumerate(job.runs)
        if row.start_s is not None
    )
    return [float(s) for s, _, _ in starts], [(p, i) for _, p, i in starts]


def _place(time_s: float, starts: list[float], where: list[tuple[int, int]], window: Window) -> tuple[int, int] | None:
    """(job position, run index) of the run holding the allocation at ``time_s``; None outside the window."""
    if not window.since_s <= time_s < window.until_s:
        return None
    at = bisect.bisect_right(starts, time_s + 2.0) - 1  # an event may be stamped a moment before sacct's Start
    return where[at] if at >= 0 else None


def _ours(facts: Sequence[JobFacts], run: RunFacts, window: Window, prices: Prices) -> list[JobOutcome]:
    """The outcomes of one run's jobs: sacct's facts with the run's events placed on its runs and its time shared."""
    starts, where = _event_runs(facts)
    preempted = [set(job.preempted_runs) for job in facts]
    for time_s in run.preempted_at_s:
        if (placed := _place(time_s, starts, where, window)) is not None:
            preempted[placed[0]].add(placed[1])
    failures = [dict(job.failures) for job in facts]
    for time_s, kind in run.failed_at_s:
        if (placed := _place(time_s, starts, where, window)) is not None:
            failures[placed[0]][placed[1]] = kind  # the run's own word wins over the state sacct saw
    held_total = sum(job.held_total_s for job in facts)
    gaps_total = sum(job.restart_gap_total_s for job in facts)
    restart_startup = max(run.restart_latency_s - gaps_total, 0.0)
    outcomes = []
    for position, job in enumerate(facts):
        share = job.held_s / held_total if held_total > 0 else 0.0
        badput = _sacct_badput(job)
        badput["startup"] = (run.startup_s + restart_startup) * share
        badput["checkpoint_stall"] = run.checkpoint_stall_s * share
        badput["lost_work"] = run.lost_work_s * share
        outcomes.append(
            JobOutcome(
                facts=job,
                run_name=run.name,
                preemptions=len(preempted[position]),
                failures=_count_kinds(failures[position].values()),
                badput_s=badput,
                productive_s=min(run.productive_s * share, job.held_s),
                mfu=run.mfu,
                cost_usd=prices.cost(job.node_s, job.gpu_s),
            )
        )
    return outcomes


def _sacct_badput(job: JobFacts) -> dict[str, float]:
    return {
        "queue": job.queue_s,
        "startup": 0.0,
        "checkpoint_stall": 0.0,
        "lost_work": 0.0,
        "restart_gap": job.restart_gap_s,
    }


def _count_kinds(kinds: Iterable[str]) -> dict[str, int]:
    counts = dict.fromkeys(FAILURE_KINDS, 0)
    for kind in kinds:
        counts[kind] += 1
    return counts


def _theirs(job: JobFacts, prices: Prices) -> JobOutcome:
    return JobOutcome(
        facts=job,
        run_name=None,
        preemptions=len(job.preempted_runs),
        failures=_count_kinds(kind for _, kind in job.failures),
        badput_s=_sacct_badput(job),
        productive_s=None,
        mfu=None,
        cost_usd=prices.cost(job.node_s, job.gpu_s),
    )


def outcomes(accounting: Accounting, window: Window, runs: Mapping[str, RunFacts], prices: Prices) -> list[JobOutcome]:
    """Every job of the window with its outcome; ``runs`` maps the job ids of our jobs to their run's facts."""
    by_run: dict[str, list[JobFacts]] = defaultdict(list)
    found: list[JobOutcome] = []
    for runs_of_job in group_jobs(accounting.rows).values():
        job = job_facts(runs_of_job, window)
        run = runs.get(job.job_id)
        if run is None:
            found.append(_theirs(job, prices))
        else:
            by_run[str(run.path)].append(job)
    for jobs in by_run.values():
        found.extend(_ours(jobs, runs[jobs[0].job_id], window, prices))
    return found


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


def _goodput(jobs: Sequence[JobOutcome]) -> dict[str, float | None]:
    wanted = sum(j.facts.wanted_node_s for j in jobs)
    held = sum(j.facts.node_s for j in jobs)
    ours = [j for j in jobs if j.productive_s is not None]
    productive_node_s = sum((j.productive_s or 0.0) * j.facts.nodes for j in ours)
    with_mfu = [j for j in ours if j.mfu is not None]
    mfu_weight = sum((j.productive_s or 0.0) * j.facts.nodes for j in with_mfu)
    scheduling = _ratio(held, wanted)
    runtime = _ratio(productive_node_s, sum(j.facts.node_s for j in ours))
    program = _ratio(sum((j.mfu or 0.0) * (j.productive_s or 0.0) * j.facts.nodes for j in with_mfu), mfu_weight)
    known = [g for g in (scheduling, runtime, program) if g is not None]
    return {
        "scheduling": scheduling,
        "runtime": runtime,
        "program": program,
        "overall": math.prod(known) if known else None,
    }


def group(key: str, jobs: Sequence[JobOutcome]) -> GroupReport:
    """The report of one tenant's (or QOS's, or the whole fleet's) jobs."""
    waits = [j.facts.queue_wait_s for j in jobs if j.facts.queue_wait_s is not None]
    requeue_waits = [w for j in jobs for w in j.facts.requeue_waits_s]
    costs = [j.cost_usd for j in jobs if j.cost_usd is not None]
    return GroupReport(
        key=key,
        jobs=len(jobs),
        node_seconds=sum(j.facts.node_s for j in jobs),
        gpu_seconds=sum(j.facts.gpu_s for j in jobs),
        queue_wait_s=Quantiles.of(waits),
        requeue_wait_s=Quantiles.of(requeue_waits),
        pending=sum(j.facts.pending for j in jobs),
        preemptions=sum(j.preemptions for j in jobs),
        requeues=sum(j.facts.requeues for j in jobs),
        failures={kind: sum(j.failures.get(kind, 0) for j in jobs) for kind in FAILURE_KINDS},
        goodput=_goodput(jobs),
        badput_s={kind: sum(j.badput_s[kind] for j in jobs) for kind in BADPUT_KINDS},
        cost_usd=sum(costs) if costs else None,
        jobs_with_records=sum(j.productive_s is not None for j in jobs),
        productive_s=sum(j.productive_s or 0.0 for j in jobs),
        queue_waits_s=tuple(waits),
        requeue_waits_s=tuple(requeue_waits),
        worst=worst_jobs(jobs, WORST_PER_GROUP),
    )


def _groups(jobs: Sequence[JobOutcome], key: Callable[[JobOutcome], str]) -> tuple[GroupReport, ...]:
    grouped: dict[str, list[JobOutcome]] = defaultdict(list)
    for job in jobs:
        grouped[key(job)].append(job)
    return tuple(group(name, members) for name, members in sorted(grouped.items()))


def worst_jobs(jobs: Iterable[JobOutcome], count: int = WORST_JOBS) -> tuple[WorstJob, ...]:
    """The jobs that lost the most time, worst first (queue and restart waits included)."""
    worst = heapq.nlargest(count, jobs, key=lambda j: (j.badput_total_s, j.facts.job_id))
    return tuple(
        WorstJob(
            j.facts.display_id,
            j.facts.account,
            j.facts.qos,
            j.run_name or j.facts.name,
            j.run_name is not None,
            dict(j.badput_s),
        )
        for j in worst
        if j.badput_total_s > 0
    )


def build_fleet_report(
    accounting: Accounting, window: Window, runs: Mapping[str, RunFacts], prices: Prices, runs_seen: int = 0
) -> FleetReport:
    """The report of a window. Pure."""
    jobs = outcomes(accounting, window, runs, prices)
    return FleetReport(
        window=window,
        tenants=_groups(jobs, lambda j: j.facts.account),
        qos=_groups(jobs, lambda j: j.facts.qos),
        total=group("(all)", jobs),
        worst=worst_jobs(jobs),
        rows=len(accounting.rows),
        malformed=accounting.malformed,
        malformed_examples=accounting.examples,
        runs_seen=runs_seen,
        prices=prices,
    )
