"""Hand a planned run to whoever runs it: one protocol, three executors.

- :class:`SbatchExecutor` (``slurm``): our rendered script through ``sbatch``
  (via :class:`SlurmClient`, as a recorded attempt: :mod:`air_hpc.ownership.attempts`);
  the script itself forwards the signal and requeues on the exit-code contract.
- :class:`SubmititSlurmExecutor` (``submitit``): submitit's SlurmExecutor with
  the script's own Slurm request (:func:`submitit_options`, from the same
  :mod:`air_hpc.render.directives` list); submitit requeues through
  :class:`~air_hpc.runtime.entry.TrainingEntry`'s ``checkpoint``, on
  ``resilience.signal`` like the other two. submitit runs ``sbatch`` itself,
  outside our client, with this process's environment (so ``SLURM_CONF`` must be exported).
- :class:`SubmititLocalExecutor` (``local``): submitit's LocalExecutor on this
  machine (one node); its controller is recorded by PID and start time.

Each one refuses, before anything is written, what it cannot do (``check``: hot
spares and containers need our batch script), records its job in
submissions.jsonl, and :func:`air_hpc.launch.submit.submit` holds the run's
owner lock around it.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import submitit

from air_hpc.config.models import JobConfig
from air_hpc.errors import ConfigError
from air_hpc.launch.plan import Plan
from air_hpc.ownership.attempts import sbatch_recorded
from air_hpc.ownership.local_job import ProcessIdentity, RecordExit
from air_hpc.records.files import atomic_write
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import Executor, record_submission
from air_hpc.render import job_environment
from air_hpc.render.directives import NO_KILL, Directive, slurm_directives
from air_hpc.render.quoting import shell_quote
from air_hpc.resilience.snapshot_fit import check_snapshot_fit
from air_hpc.runtime.entry import TrainingEntry
from air_hpc.slurm.client import SlurmClient
from air_hpc.slurm.cluster import parse_minutes

#: Builds the picklable callable that submitit runs on every rank.
EntryFactory = Callable[[Path], Callable[[], Any]]

#: submitit reads its preemption signal from this variable when it is imported (USR2 without it).
SUBMITIT_SIGNAL_ENV = "SUBMITIT_PREEMPT_SIGNAL"


def default_entry(run_dir: Path) -> Callable[[], Any]:
    return TrainingEntry(run_dir)


@dataclass(frozen=True)
class Launched:
    """A job the executor handed over and recorded."""

    job_id: str
    process: ProcessIdentity | None = None
    """Local executor: the controller process (its PID is the job id)."""
    handle: Any = field(default=None, compare=False)
    """submitit's job object for the local executor."""


class JobExecutor(Protocol):
    """Submits a planned run whose directory is written, records the job id, and says what it launched."""

    @property
    def name(self) -> Executor: ...

    def check(self, job: JobConfig) -> None:
        """Refuse (:class:`ConfigError`, naming the key) what this executor cannot do, before anything is written."""

    def launch(self, plan: Plan, run_dir: RunDir) -> Launched: ...


@dataclass(frozen=True)
class SbatchExecutor:
    client: SlurmClient
    name: Executor = "slurm"

    def check(self, job: JobConfig) -> None:
        """Our own batch script does everything the job config asks, within the nodes' host memory."""
        check_snapshot_fit(job)

    def launch(self, plan: Plan, run_dir: RunDir) -> Launched:
        return Launched(sbatch_recorded(self.client, run_dir, plan.job.run.name))


@dataclass(frozen=True)
class SubmititSlurmExecutor:
    entry: EntryFactory = default_entry
    name: Executor = "submitit"

    def check(self, job: JobConfig) -> None:
        _refuse_container(job, self.name)
        _refuse_snapshots(job, self.name)
        submitit_options(slurm_directives(job))

    def launch(self, plan: Plan, run_dir: RunDir) -> Launched:
        executor = submitit.SlurmExecutor(
            folder=run_dir.path / "submitit", max_num_timeout=plan.job.resilience.max_restarts
        )
        executor.update_parameters(**submitit_slurm_parameters(plan, run_dir))
        job_id = str(executor.submit(self.entry(run_dir.path)).job_id)
        record_submission(run_dir, job_id, self.name)
        return Launched(job_id)


@dataclass(frozen=True)
class SubmititLocalExecutor:
    entry: EntryFactory = default_entry
    name: Executor = "local"

    def check(self, job: JobConfig) -> None:
        res = job.resources
        if res.nodes != 1:
            raise ConfigError(f"resources.nodes: the local executor runs on one node, the job asks for {res.nodes}")
        if res.spare_nodes:
            raise ConfigError(f"resources.spare_nodes: {_NO_SPARES.format(executor=self.name)}")
        _refuse_container(job, self.name)
        _refuse_snapshots(job, self.name)

    def launch(self, plan: Plan, run_dir: RunDir) -> Launched:
        job = plan.job
        executor = submitit.LocalExecutor(folder=run_dir.path / "submitit", max_num_timeout=job.resilience.max_restarts)
        executor.update_parameters(
            nodes=1,
            tasks_per_node=job.resources.tasks_per_node,
            gpus_per_node=job.hardware.gpus_per_node if job.hardware.device == "cuda" else 0,
            timeout_min=job.resources.time_limit_min,
            signal_delay_s=job.resilience.signal_lead_s,
            setup=_exports(_submitit_env(job, job_environment(job))),
        )
        handle = executor.submit(RecordExit(self.entry(run_dir.path), run_dir.path))
        job_id = str(handle.job_id)
        process = ProcessIdentity.of(int(job_id))
        record_submission(run_dir, job_id, self.name, pid_started_s=process.started_s)
        return Launched(job_id, process, handle)


def make_executor(name: Executor, client: SlurmClient, entry: EntryFactory = default_entry) -> JobExecutor:
    """The executor called ``name`` (the ``--executor`` choice)."""
    if name == "slurm":
        return SbatchExecutor(client)
    if name == "submitit":
        return SubmititSlurmExecutor(entry)
    return SubmititLocalExecutor(entry)


def _refuse_snapshots(job: JobConfig, executor: str) -> None:
    """In-memory snapshots live in holders the in-job supervisor starts, which only our batch script runs."""
    if job.checkpoint.memory_interval_steps:
        raise ConfigError(
            f"checkpoint.memory_interval_steps: the {executor} executor cannot keep in-memory snapshots (their "
            "per-node holders belong to the in-job supervisor of the slurm executor's batch script); use "
            "--executor slurm, or checkpoint.memory_interval_steps=0"
        )


_NO_SPARES = (
    "the {executor} executor cannot keep hot spares (restarting the step on a spare is the in-job supervisor's, "
    "which only the slurm executor's batch script runs); use --executor slurm, or no spares"
)


def _refuse_container(job: JobConfig, executor: Executor) -> None:
    if job.container is not None:
        raise ConfigError(
            f"container.image: the {executor} executor starts its own step without the container "
            "(only the slurm executor's batch script runs srun under pyxis); use --executor slurm"
        )


def _exports(env: dict[str, str]) -> list[str]:
    return [f"export {name}={shell_quote(value)}" for name, value in sorted(env.items())]


def _submitit_env(job: JobConfig, env: dict[str, str]) -> dict[str, str]:
    """The job's environment plus ``resilience.signal`` as submitit's own preemption signal on every rank."""
    return {**env, SUBMITIT_SIGNAL_ENV: job.resilience.signal}


#: What submitit decides itself, whatever the script asks: the logs go into its folder (it reads them back), and
#: the job runs in the submitting directory, from which the pickled callable's module is imported.
SUBMITIT_DECIDES = frozenset({"output", "error", "chdir"})

#: Options submitit reads as its own parameters: it counts the tasks it waits for from nodes x ntasks_per_node and
#: tells a time-out from a preemption by ``time`` (minutes); it writes them as the same ``#SBATCH`` lines.
_SUBMITIT_NATIVE = {"job-name": "job_name", "nodes": "nodes", "ntasks-per-node": "ntasks_per_node", "time": "time"}


def submitit_options(directives: Sequence[Directive]) -> dict[str, Any]:
    """submitit's SlurmExecutor parameters for the script's Slurm request: the same options, the same values.

    Options submitit knows go in as its parameters, the rest as ``additional_parameters``.
    submitit quotes each value for the shell, but sbatch reads a backslash as an escape even
    inside quotes, so backslashes are doubled. The stop signal goes to every task, where
    submitit's handler runs (no ``B:``: submitit's script has no shell of ours to forward it).
    Raises :class:`ConfigError` naming the key of an option submitit cannot honour (hot spares).
    """
    native: dict[str, Any] = {}
    additional: dict[str, Any] = {}
    for directive in directives:
        if directive.option == NO_KILL:
            raise ConfigError(f"{directive.key}: {_NO_SPARES.format(executor='submitit')}")
        if directive.option in SUBMITIT_DECIDES:
            continue
        if directive.value is None:
            additional[directive.option] = True
            continue
        value = directive.value.replace("\\", "\\\\")
        if directive.option == "signal":
            value = value.removeprefix("B:")
        if directive.option in ("nodes", "ntasks-per-node"):
            native[_SUBMITIT_NATIVE[directive.option]] = int(value)
        elif directive.option == "time":
            native["time"] = parse_minutes(value)
        elif directive.option in _SUBMITIT_NATIVE:
            native[_SUBMITIT_NATIVE[directive.option]] = value
        else:
            additional[directive.option] = value
    return {**native, "additional_parameters": additional}


def submitit_slurm_parameters(plan: Plan, run_dir: RunDir) -> dict[str, Any]:
    """submitit's SlurmExecutor parameters for the plan: its Slurm request (:func:`submitit_options`), the
    environment, and the rank order, which it writes to the run's hostfile when the plan pins one."""
    spec, job = plan.spec, plan.job
    setup = _exports(_submitit_env(job, dict(spec.env)))
    srun_args = ["--kill-on-bad-exit=1"]
    if spec.request.rank_hosts:
        hostfile = run_dir.hostfile
        atomic_write(hostfile, "".join(f"{h}\n" for h in spec.request.rank_hosts), durable=False)
        setup.append(f"export SLURM_HOSTFILE={shell_quote(str(hostfile))}")
        srun_args.append("--distribution=arbitrary")
    return {**submitit_options(spec.directives), "setup": setup, "srun_args": srun_args}
