"""Run a job on the testbed twice, one copy under a seeded fault schedule, and judge the faulted copy.

Both copies are submitted at once under fresh run names (``<name>-reference-…``
and ``<name>-chaos-…``); faults strike the chaos copy one at a time, each only
after the previous one has been recovered from (a step logged after it).
"""

import functools
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from air_hpc.chaos.inject import INJECTORS, InjectionError, NodeControl, Target, check_cluster
from air_hpc.chaos.outcome import CampaignResult, Injection, outcomes
from air_hpc.chaos.schedule import NO_RESTART_KINDS, Fault, plan
from air_hpc.config.load import load_job
from air_hpc.config.models import JobConfig
from air_hpc.errors import AirHpcError, UserError
from air_hpc.launch.submit import submit
from air_hpc.observe.compare import compare_runs
from air_hpc.observe.records import START_KIND, load_records
from air_hpc.observe.report import build_report
from air_hpc.records.rundir import RunDir
from air_hpc.slurm.client import SlurmClient
from air_hpc.train.metrics import read_metrics

log = logging.getLogger(__name__)

TESTBED_CLUSTER = "testbed"


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
    poll_s: float = 0.2


def testbed_job(job_file: Path, overrides: Sequence[str]) -> JobConfig:
    """The job as given; one clear line when it is not meant for the testbed."""
    job = load_job(job_file, list(overrides))
    if job.cluster.name != TESTBED_CLUSTER:
        raise UserError(
            f"{job_file}: cluster {job.cluster.name!r}; air-hpc chaos runs only on the local testbed "
            f"(cluster: {TESTBED_CLUSTER})"
        )
    return job


def _jobs(campaign: Campaign) -> tuple[JobConfig, JobConfig]:
    base = testbed_job(campaign.job_file, campaign.overrides)
    stamp = time.strftime("%Y%m%d-%H%M%S")

    def named(role: str) -> JobConfig:
        return load_job(
            campaign.job_file,
            [
                *campaign.overrides,
                f"run.name={base.run.name}-{role}-s{campaign.seed}-{stamp}",
                f"cluster.topology_file={campaign.topology_conf}",
                "cluster.exclusive=true",  # never a node shared at once: a fault on one copy never reaches the other
            ],
        )

    return named("reference"), named("chaos")


def _recovered(run_dir: RunDir, since_s: float, restarts: bool) -> bool:
    """A step was logged after ``since_s`` (and, when the fault restarts the job, after a start since then)."""
    records = load_records(run_dir)
    after = since_s
    if restarts:
        starts = [e.time_s for e in records.of_kind(START_KIND) if e.time_s >= since_s]
        if not starts:
            return False
        after = starts[0]
    return any(s.time_s is not None and s.time_s > after for s in records.steps)


def _ended(client: SlurmClient, job_id: str) -> str | None:
    status = client.job_status(job_id)
    return str(status.state) if status is not None and status.state.terminal else None


def _wait_until(what: str, condition: Callable[[], bool], client: SlurmClient, job_id: str, c: Campaign) -> bool:
    """Poll ``condition``; False when the job ended first."""
    deadline = time.monotonic() + c.timeout_s
    while not condition():
        if _ended(client, job_id):
            return False
        if time.monotonic() > deadline:
            raise CampaignError(f"job {job_id}: {what} did not happen in {c.timeout_s:g} s")
        time.sleep(c.poll_s)
    return True


def _last_step(run_dir: RunDir) -> int:
    return max((int(r["step"]) for r in read_metrics(run_dir.metrics)), default=0)


def _reached(run_dir: RunDir, step: int) -> bool:
    return _last_step(run_dir) >= step


def _wait_ended(client: SlurmClient, job_id: str, c: Campaign) -> str:
    deadline = time.monotonic() + c.timeout_s
    while (state := _ended(client, job_id)) is None:
        if time.monotonic() > deadline:
            raise CampaignError(f"job {job_id} did not end in {c.timeout_s:g} s")
        time.sleep(1.0)
    return state


def _strike(
    campaign: Campaign, faults: Sequence[Fault], target: Target, on_fault: Callable[[Injection], None]
) -> list[Injection]:
    """Each fault once the run reached its step and recovered from the previous one."""
    client, job_id, run_dir = target.client, target.job_id, target.run_dir
    injections: list[Injection] = []
    for fault in faults:
        if injections:
            last = injections[-1]
            restarts = last.fault.kind not in NO_RESTART_KINDS
            recovered = functools.partial(_recovered, run_dir, last.injected_s, restarts and not last.missed)
            if not _wait_until(f"recovery from fault {last.fault.number}", recovered, client, job_id, campaign):
                break
        reached = functools.partial(_reached, run_dir, fault.after_step)
        if not _wait_until(f"step {fault.after_step}", reached, client, job_id, campaign):
            break
        time.sleep(fault.delay_s)
        since, step = time.time(), _last_step(run_dir)
        try:
            injection = Injection(fault, since, INJECTORS[fault.kind](target), step)
        except InjectionError as exc:
            injection = Injection(fault, since, "", step, missed=str(exc))
        injections.append(injection)
        on_fault(injection)
    if len(injections) < len(faults):
        log.warning("job %s ended after %d of %d faults", job_id, len(injections), len(faults))
    return injections


def _cancel(client: SlurmClient, job_ids: Sequence[str]) -> None:
    """A campaign that cannot go on leaves no copy behind holding testbed nodes."""
    for job_id in job_ids:
        try:
            client.scancel(job_id)
        except AirHpcError as exc:
            log.warning("could not cancel job %s: %s", job_id, exc)


def run_campaign(
    campaign: Campaign,
    client: SlurmClient,
    on_fault: Callable[[Injection], None] = lambda _: None,
    node_control: NodeControl | None = None,
) -> tuple[CampaignResult, Sequence[Injection], RunDir, RunDir]:
    """Submit both copies, inject the schedule into one, wait for both to end, compare; killed nodes come back."""
    check_cluster(campaign.kinds, client)
    reference_job, chaos_job = _jobs(campaign)
    faults = plan(campaign.kinds, campaign.count, campaign.seed, chaos_job.train.steps)
    reference = submit(reference_job, "slurm", client)
    chaos = submit(chaos_job, "slurm", client)
    run_dir = RunDir(chaos.run_dir)
    target = Target(
        job_id=chaos.job_id,
        run_dir=run_dir,
        client=client,
        signal=chaos_job.resilience.signal,
        nodes=chaos_job.resources.nodes,
        rng=random.Random(campaign.seed),
        node_control=node_control,
    )
    try:
        injections = _strike(campaign, faults, target, on_fault)
        final_state = _wait_ended(client, chaos.job_id, campaign)
        _wait_ended(client, reference.job_id, campaign)
    except BaseException:
        _cancel(client, (chaos.job_id, reference.job_id))
        raise
    finally:
        for node in target.killed:
            if node_control is not None:
                node_control.restart_node(node)
    records = load_records(run_dir)
    mine, theirs = build_report(records), build_report(load_records(RunDir(reference.run_dir)))
    result = CampaignResult(
        scheduled=len(faults),
        faults=outcomes(records, injections),
        final_state=final_state,
        comparison=compare_runs(run_dir, RunDir(reference.run_dir), chaos_job.train.steps),
        goodput=mine.goodput if mine else None,
        reference_goodput=theirs.goodput if theirs else None,
    )
    return result, injections, run_dir, RunDir(reference.run_dir)
