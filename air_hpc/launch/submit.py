"""Submit a run: check it, plan it, write its directory, and hand it to an executor under the run's owner lock.

The steps live in their own modules: :mod:`air_hpc.launch.plan` (nodes and the
rendered script), :mod:`air_hpc.launch.executors` (sbatch, submitit on Slurm,
submitit locally), :mod:`air_hpc.ownership.owner` (one live job per run
directory) and :mod:`air_hpc.ops.waiting` (following the job, within a deadline).

The run directory records the resolved config (job.json), the script
(job.sbatch) and every job id (submissions.jsonl), so status, logs and
resume all start from it.
"""

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from air_hpc.config.models import JobConfig
from air_hpc.data.blend import check_for_training
from air_hpc.errors import AirHpcError, CheckpointError, ConfigError, SlurmError, SlurmUnreachableError
from air_hpc.exitcodes import ExitCode
from air_hpc.launch.chain import check_chain, dependency
from air_hpc.launch.executors import EntryFactory, default_entry, make_executor
from air_hpc.launch.plan import Plan, plan
from air_hpc.launch.resume import check_resume, set_aside
from air_hpc.launch.route import RouteDecision
from air_hpc.observe.records import load_records, longest_sync_save_s
from air_hpc.ownership.attempts import recorded_jobs
from air_hpc.ownership.owner import Owner, claim
from air_hpc.records.events import EventLog, Route
from air_hpc.records.files import atomic_write
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import Executor
from air_hpc.resilience.store import CheckpointStore
from air_hpc.slurm.client import SlurmClient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Submission:
    job_id: str
    executor: Executor
    run_dir: Path
    plan: Plan
    handle: Any = field(default=None, compare=False)
    """submitit's job object for the local executor."""
    set_aside: Path | None = None
    """Where ``fresh`` moved the run's previous directory."""
    chain: tuple[str, ...] = ()
    """``--chain N``: every link's job id, the first being ``job_id``."""
    route: RouteDecision | None = None
    """``--clusters``: the cluster chosen and why."""

    def to_json(self) -> dict[str, object]:
        return {
            "job_id": self.job_id,
            "executor": self.executor,
            "run_dir": str(self.run_dir),
            "set_aside": None if self.set_aside is None else str(self.set_aside),
            "script": str(RunDir(self.run_dir).sbatch),
            "nodelist": self.plan.request.nodelist,
            "switches": self.plan.request.switches,
            "segment": self.plan.request.segment,
            "chain": list(self.chain),
            "cluster": None if self.route is None else self.route.cluster,
            "route": None
            if self.route is None
            else {"reason": self.route.reason, "answers": [a.to_json() for a in self.route.answers]},
            "test_only": None
            if self.plan.test_only is None
            else {"start": self.plan.test_only.start, "nodelist": self.plan.test_only.nodelist},
        }


class RunComplete(AirHpcError):
    """The run's final checkpoint exists: there is nothing left to train."""

    exit_code = ExitCode.OK


def submit(
    job: JobConfig,
    executor: Executor,
    client: SlurmClient,
    *,
    python: str | None = None,
    entry: EntryFactory = default_entry,
    step_command: Sequence[str] | None = None,
    force: bool = False,
    fresh: bool = False,
    after: str | None = None,
    chain: int = 1,
    route: RouteDecision | None = None,
) -> Submission:
    """Validate, record and submit; returns once the job has an id (:mod:`air_hpc.ops.waiting` follows it).

    Refuses what the executor cannot do (:meth:`~air_hpc.launch.executors.JobExecutor.check`), a run
    that is complete (:class:`RunComplete`, unless ``force``) and a run directory that another live
    job owns (:class:`~air_hpc.ownership.owner.RunBusyError`), including a job whose earlier submit
    lost sbatch's answer (settled first, :func:`~air_hpc.ownership.attempts.recorded_jobs`).
    Refuses checkpoints the job cannot load (:func:`~air_hpc.launch.resume.check_resume`); ``fresh``
    moves the run's existing directory aside (under the owner lock, once no live job owns it) and starts anew.
    ``after``: a Slurm dependency (``afterok:12``); ``chain``: links of one run, one at a time
    (:mod:`air_hpc.launch.chain`). ``route``: the cluster ``submit --clusters`` chose (``client`` is aimed at
    it), recorded as a ``route`` event once the job has an id.
    """
    backend = make_executor(executor, client, entry)
    backend.check(job)
    check_chain(job, executor, chain)
    if after is not None and executor == "local":
        raise ConfigError("--after: the local executor has no Slurm to wait with; use --executor slurm or submitit")
    check_resume(job, fresh)
    check_not_complete(job, fresh, force)
    if step_command is None:
        check_data(job)
    if executor != "local":
        check_grace(job, client)
    plan_ = plan(
        job,
        None if executor == "local" else client,
        python=python,
        test_only=executor != "local",
        step_command=step_command,
        dependency=dependency(after, chain),
    )
    for note in plan_.notes:
        log.info("%s", note)
    run = RunDir.of(job)
    with claim(run, lambda owner: owner_is_live(owner, client), lambda: recorded_jobs(run, client)) as take_ownership:
        aside = set_aside(run) if fresh else None
        run_dir = write_run(plan_)
        launched = backend.launch(plan_, run_dir)
        links = (launched.job_id, *more_links(client, run_dir, chain - 1)) if chain > 1 else ()
        take_ownership(launched.job_id, executor, launched.process, chain=links)
    if route is not None:
        record_route(run_dir, route, launched.job_id)
    log.info("submitted job %s (%s) for run %s", launched.job_id, executor, run_dir.path)
    return Submission(launched.job_id, executor, run_dir.path, plan_, launched.handle, aside, links, route)


def check_not_complete(job: JobConfig, fresh: bool, force: bool) -> None:
    """:class:`RunComplete` when the run's final checkpoint exists (unless ``force``, or ``fresh`` starts anew)."""
    final = None if fresh else completed_step(job)
    if final is not None and not force:
        raise RunComplete(
            f"{RunDir.of(job).path} is complete: its final checkpoint (step {final}) exists for "
            f"train.steps={job.train.steps}; nothing submitted. --force submits anyway; "
            "a higher train.steps (--set train.steps=N) continues the run"
        )


def record_route(run_dir: RunDir, route: RouteDecision, job_id: str) -> None:
    """The ``route`` event: the cluster ``--clusters`` chose for the job, why, and what each cluster answered."""
    answers = [answer.to_json() for answer in route.answers]
    EventLog(run_dir.events).emit(Route(route.cluster, job_id, route.reason, answers))


def more_links(client: SlurmClient, run_dir: RunDir, count: int) -> list[str]:
    """The chain's further links: the same script again (``--dependency=singleton`` waits its turn)."""
    links: list[str] = []
    for _ in range(count):
        try:
            links.append(client.sbatch(run_dir.sbatch, [f"--comment=air-hpc-{uuid.uuid4().hex}"]))
        except SlurmError as exc:
            log.warning("the chain has %d link(s) only: submitting the next failed: %s", len(links) + 1, exc)
            break
    return links


def check_data(job: JobConfig) -> None:
    """The training data against the model, so a missing or short corpus is one line now, not a failed job."""
    check_for_training(job.data, job.model.seq_len, job.model.vocab_size)


def check_grace(job: JobConfig, client: SlurmClient) -> None:
    """Refuse a run whose measured preemption save (from its earlier starts) outlasts the partition's GraceTime."""
    run_dir = RunDir.of(job)
    measured_s = longest_sync_save_s(load_records(run_dir).events)
    if measured_s is None:
        return
    try:
        partitions = client.partitions()
    except SlurmUnreachableError as exc:
        log.warning("cannot compare the save time with the partition's GraceTime: %s", exc)
        return
    wanted = job.cluster.partition
    grace_s = next((p.grace_time_s for p in partitions if (p.name == wanted if wanted else p.default)), None)
    if grace_s and grace_s < measured_s:
        name = job.cluster.partition or "(the default partition)"
        raise ConfigError(
            f"cluster.partition: {name} gives a preempted job a GraceTime of {grace_s} s, shorter than this run's "
            f"measured checkpoint save of {measured_s:.1f} s ({run_dir.events}): a preemption would kill the save; "
            "use a partition with a longer GraceTime or make the save faster"
        )


def completed_step(job: JobConfig) -> int | None:
    """The step of the run's final checkpoint (``train.steps`` or later, passing the size check), else None."""
    store = CheckpointStore(RunDir.of(job).checkpoints, job.checkpoint.keep_last)
    for step in sorted(store.committed_steps(), reverse=True):
        if step < job.train.steps:
            return None
        try:
            store.verify(step, check="size")
        except CheckpointError:
            continue
        return step
    return None


def write_run(plan_: Plan) -> RunDir:
    """Create the run directory with the resolved config and the script (logs/ must exist before sbatch)."""
    run_dir = RunDir.of(plan_.job)
    run_dir.logs.mkdir(parents=True, exist_ok=True)
    run_dir.write_job(plan_.job)
    atomic_write(run_dir.sbatch, plan_.script, durable=False)
    run_dir.sbatch.chmod(0o755)
    return run_dir


def owner_is_live(owner: Owner, client: SlurmClient) -> bool:
    """The job that owns a run still runs (a requeued, pending job counts): local by its process, else Slurm."""
    if owner.executor == "local":
        return owner.local_process_alive()
    status = client.job_status(owner.job_id)
    return status is not None and not status.state.terminal
