"""Run a job on the testbed twice, one copy under a seeded fault schedule, and judge the faulted copy.

Both copies are submitted at once under fresh run names (``<name>-reference-…``
and ``<name>-chaos-…``); faults strike the chaos copy one at a time, each only
after the previous one has been recovered from (a step logged after it), at
its step (see :mod:`air_hpc.chaos.schedule`). A fault that can no longer strike
(the run trained its last step, the job ended) is skipped with the reason.
"""

import functools
import logging
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from air_hpc.chaos.inject import INJECTORS, InjectionError, NodeControl, Target, check_cluster, continue_stopped
from air_hpc.chaos.outcome import CampaignResult, Injection, outcomes
from air_hpc.chaos.schedule import NO_RESTART_KINDS, Fault, plan
from air_hpc.config.load import load_job
from air_hpc.config.models import JobConfig
from air_hpc.errors import AirHpcError, UserError
from air_hpc.launch.submit import Submission, submit
from air_hpc.observe.compare import compare_runs
from air_hpc.observe.records import StepRecord, load_records, parse_events, parse_steps
from air_hpc.observe.report import build_report
from air_hpc.records.events import EventKind
from air_hpc.records.jsonl import read_jsonl
from air_hpc.records.metrics import read_metrics
from air_hpc.records.rundir import RunDir
from air_hpc.slurm.client import SlurmClient

log = logging.getLogger(__name__)

TESTBED_CLUSTER = "testbed"
#: Fault kinds that freeze a rank, which only a hang limit notices.
HANG_KINDS = frozenset({"hang", "ckpt-hang"})
#: How often the campaign asks Slurm whether the chaos copy ended (its steps are read far more often).
JOB_STATE_EVERY_S = 1.0


class CampaignError(AirHpcError):
    """The campaign could not go on (a job vanished, training stalled past the timeout)."""


@dataclass(frozen=True)
class Campaign:
    job_file: Path
    overrides: tuple[str, ...]
    kinds: tuple[str, ...]
    count: int
    seed: int
    topology_conf: Path
    timeout_s: float = 900.0
    poll_s: float = 0.05
    """How often the run's steps are read: well inside a step, so a fault strikes at its step on a fast machine."""


def testbed_job(job_file: Path, overrides: Sequence[str]) -> JobConfig:
    """The job as given; one clear line when it is not meant for the testbed."""
    job = load_job(job_file, list(overrides))
    if job.cluster.name != TESTBED_CLUSTER:
        raise UserError(
            f"{job_file}: cluster {job.cluster.name!r}; air-hpc chaos runs only on the local testbed "
            f"(cluster: {TESTBED_CLUSTER})"
        )
    return job


def hang_limit(job: JobConfig) -> tuple[int, str]:
    """How long a stopped rank can go unnoticed, and the key that sets it: the watchdog's longer limit of a step
    and a save (a rank may stop in either), or without a watchdog the supervisor's backstop."""
    from air_hpc.runtime.supervisor import hang_backstop_s

    h = job.health
    if not h.watchdog:
        return hang_backstop_s(job), "the supervisor's hang backstop (health.watchdog is off)"
    if h.heartbeat_checkpoint_s > h.heartbeat_step_s:
        return h.heartbeat_checkpoint_s, "health.heartbeat_checkpoint_s"
    return h.heartbeat_step_s, "health.heartbeat_step_s"


def timeout_warning(job: JobConfig, kinds: Sequence[str], timeout_s: float) -> str:
    """Why a hang fault would outlast ``--timeout-s`` (the campaign would give up before the hang is detected);
    empty when it would not, or when no hang is scheduled."""
    if not HANG_KINDS.intersection(kinds):
        return ""
    limit_s, key = hang_limit(job)
    if timeout_s > limit_s:
        return ""
    return (
        f"--timeout-s {timeout_s:g} is not longer than the job's hang limit ({key} = {limit_s} s, in force until "
        "a shorter one is learned from the run): the campaign "
        f"would give up on a hang before it is detected; give --timeout-s above {limit_s} (plus a requeue's "
        "time) or lower the limit with --set"
    )


def _jobs(campaign: Campaign) -> tuple[JobConfig, JobConfig]:
    base = testbed_job(campaign.job_file, campaign.overrides)
    stamp = time.strftime("%Y%m%d-%H%M%S")

    def named(role: str, *extra: str) -> JobConfig:
        return load_job(
            campaign.job_file,
            [
                *campaign.overrides,
                f"run.name={base.run.name}-{role}-s{campaign.seed}-{stamp}",
                f"cluster.topology_file={campaign.topology_conf}",
                "cluster.exclusive=true",  # never a node shared at once: a fault on one copy never reaches the other
                *extra,
            ],
        )

    # The reference is never struck: spares would only hold nodes the chaos copy's spares need at the same time.
    return named("reference", "resources.spare_nodes=0"), named("chaos")


class _Watch:
    """The chaos copy as the campaign sees it: its logged steps (read often, cheaply) and its Slurm state (rarely)."""

    def __init__(self, target: Target, campaign: Campaign, total_steps: int) -> None:
        self.target, self.campaign, self.total_steps = target, campaign, total_steps
        self._state: str | None = None
        self._state_read_s = -float("inf")

    def steps(self) -> tuple[StepRecord, ...]:
        return parse_steps(read_metrics(self.target.run_dir.metrics))

    def last_step(self) -> int:
        return max((s.step for s in self.steps()), default=0)

    def reached(self, step: int) -> bool:
        return self.last_step() >= step

    def step_time_s(self) -> float:
        """The run's recent step time (median of the last few steps), to place a fault inside a step."""
        times = [s.step_time_s for s in self.steps()[-5:] if s.step_time_s is not None]
        return statistics.median(times) if times else 0.0

    def ended(self) -> str | None:
        """The job's final state once it ended; squeue at most once a second (a poll every 0.05 s)."""
        if self._state is None and time.monotonic() - self._state_read_s >= JOB_STATE_EVERY_S:
            self._state_read_s = time.monotonic()
            self._state = _ended(self.target.client, self.target.job_id)
        return self._state

    def no_training_left(self) -> str:
        """Why a fault can no longer strike (the job ended, or the run logged its last step); empty when it can."""
        if (last := self.last_step()) >= self.total_steps:
            return f"the run had trained its last step ({last} of {self.total_steps}) before it could strike"
        if state := self.ended():
            return f"the job had ended ({state}) before it could strike"
        return ""

    def wait(self, what: str, condition: Callable[[], bool]) -> str:
        """Poll ``condition``: empty once it holds, else why it never can (:meth:`no_training_left`)."""
        deadline = time.monotonic() + self.campaign.timeout_s
        while not condition():
            if reason := self.no_training_left():
                return reason
            if time.monotonic() > deadline:
                raise CampaignError(f"job {self.target.job_id}: {what} did not happen in {self.campaign.timeout_s:g} s")
            time.sleep(self.campaign.poll_s)
        return ""

    def recovered(self, injection: Injection) -> bool:
        """A step was logged after the fault (and, when it restarts the job, after a start since then)."""
        after = injection.injected_s
        if injection.fault.kind not in NO_RESTART_KINDS:
            events = parse_events(read_jsonl(self.target.run_dir.events))
            starts = [e.time_s for e in events if e.kind == EventKind.START and e.time_s >= after]
            if not starts:
                return False
            after = starts[0]
        return any(s.time_s is not None and s.time_s > after for s in self.steps())


def _ended(client: SlurmClient, job_id: str) -> str | None:
    status = client.job_status(job_id)
    return str(status.state) if status is not None and status.state.terminal else None


def _wait_ended(client: SlurmClient, job_id: str, c: Campaign) -> str:
    deadline = time.monotonic() + c.timeout_s
    while (state := _ended(client, job_id)) is None:
        if time.monotonic() > deadline:
            raise CampaignError(f"job {job_id} did not end in {c.timeout_s:g} s")
        time.sleep(1.0)
    return state


def _inject(fault: Fault, watch: _Watch) -> Injection:
    """Strike now, or at the next moment the injector can (its target between restarts, no save under way yet);
    skipped, with the reason, once the run can no longer be struck."""
    deadline = time.monotonic() + watch.campaign.timeout_s
    while True:
        if reason := watch.no_training_left():
            return Injection(fault, time.time(), "", watch.last_step(), skipped=reason)
        since, step = time.time(), watch.last_step()
        try:
            return Injection(fault, since, INJECTORS[fault.kind](watch.target), step)
        except InjectionError as exc:
            if time.monotonic() > deadline:
                why = f"could not be injected in {watch.campaign.timeout_s:g} s: {exc}"
                return Injection(fault, since, "", step, skipped=why)
            log.info("fault %d %s: %s; trying again", fault.number, fault.kind, exc)
            time.sleep(watch.campaign.poll_s)


def _strike(
    campaign: Campaign, faults: Sequence[Fault], watch: _Watch, on_fault: Callable[[Injection], None]
) -> list[Injection]:
    """Each fault once the run reached its step and recovered from the previous one; a fault that can no longer
    strike is skipped with the reason (it tests nothing and loses nothing)."""
    injections: list[Injection] = []
    for fault in faults:
        reason = ""
        if injections and not injections[-1].skipped:
            last = injections[-1]
            reason = watch.wait(f"recovery from fault {last.fault.number}", functools.partial(watch.recovered, last))
        if not reason:
            reason = watch.wait(f"step {fault.after_step}", functools.partial(watch.reached, fault.after_step))
        if not reason:
            time.sleep(fault.delay_steps * watch.step_time_s())
        injection = _inject(fault, watch) if not reason else Injection(fault, time.time(), "", 0, skipped=reason)
        injections.append(injection)
        on_fault(injection)
    return injections


def _cancel(client: SlurmClient, job_ids: Sequence[str], say: Callable[[str], None]) -> None:
    """A campaign that cannot go on leaves no copy behind holding testbed nodes; one that already ended is said."""
    cancelled = []
    for job_id in job_ids:
        try:
            if state := _ended(client, job_id):
                say(f"job {job_id} had already ended ({state})")
                continue
            client.scancel(job_id)
            cancelled.append(job_id)
        except AirHpcError as exc:
            log.warning("could not cancel job %s: %s", job_id, exc)
    if cancelled:
        say(f"cancelled job(s) {', '.join(cancelled)}")


def _clean_up(
    client: SlurmClient, target: Target | None, unfinished: Sequence[str], say: Callable[[str], None]
) -> None:
    """However the campaign ends: stopped ranks continue, ``unfinished`` copies are cancelled, killed nodes come
    back. Ranks continue first, so that a cancelled job's ranks can act on their SIGTERM."""
    if target is not None and (continued := continue_stopped(target)):
        say(f"continued {continued} stopped rank process(es) (SIGCONT)")
    _cancel(client, unfinished, say)
    if target is None or target.node_control is None:
        return
    for node in target.killed:
        target.node_control.restart_node(node)
        say(f"node {node} brought back")


def _target(
    campaign: Campaign, job: JobConfig, chaos: Submission, client: SlurmClient, nodes: NodeControl | None
) -> Target:
    return Target(
        job_id=chaos.job_id,
        run_dir=RunDir(chaos.run_dir),
        client=client,
        signal=job.resilience.signal,
        nodes=job.resources.nodes,
        rng=random.Random(campaign.seed),
        node_control=nodes,
    )


def run_campaign(
    campaign: Campaign,
    client: SlurmClient,
    on_fault: Callable[[Injection], None] = lambda _: None,
    node_control: NodeControl | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> tuple[CampaignResult, Sequence[Injection], RunDir, RunDir]:
    """Submit both copies, inject the schedule into one, wait for both to end, compare.

    However it ends (an error, a timeout, Ctrl-C or SIGTERM raised as :class:`KeyboardInterrupt`), stopped ranks
    continue, killed nodes come back, and a copy still in Slurm is cancelled. ``say`` gets a line per step.
    """
    check_cluster(campaign.kinds, client)
    reference_job, chaos_job = _jobs(campaign)
    faults = plan(campaign.kinds, campaign.count, campaign.seed, chaos_job.train.steps)
    submitted: list[str] = []
    target: Target | None = None
    try:
        reference = submit(reference_job, "slurm", client)
        submitted.append(reference.job_id)
        chaos = submit(chaos_job, "slurm", client)
        submitted.append(chaos.job_id)
        say(f"submitted job {chaos.job_id} (faults) and job {reference.job_id} (reference); {len(faults)} fault(s)")
        target = _target(campaign, chaos_job, chaos, client, node_control)
        injections = _strike(campaign, faults, _Watch(target, campaign, chaos_job.train.steps), on_fault)
        say(f"waiting for jobs {chaos.job_id} and {reference.job_id} to end")
        final_state = _wait_ended(client, chaos.job_id, campaign)
        _wait_ended(client, reference.job_id, campaign)
        submitted.clear()  # both ended: nothing to cancel
    finally:
        _clean_up(client, target, submitted, say)
    run_dir, reference_dir = RunDir(chaos.run_dir), RunDir(reference.run_dir)
    records = load_records(run_dir)
    mine, theirs = build_report(records), build_report(load_records(reference_dir))
    result = CampaignResult(
        scheduled=len(faults),
        faults=outcomes(records, injections),
        final_state=final_state,
        comparison=compare_runs(run_dir, reference_dir, chaos_job.train.steps),
        goodput=mine.goodput if mine else None,
        reference_goodput=theirs.goodput if theirs else None,
        wall_s=round(mine.wall_s, 3) if mine else None,
        reference_wall_s=round(theirs.wall_s, 3) if theirs else None,
    )
    return result, injections, run_dir, reference_dir
