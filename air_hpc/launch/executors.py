"""Hand a planned run to whoever runs it: one protocol, three executors.

- :class:`SbatchExecutor` (``slurm``): our rendered script through ``sbatch``
  (via :class:`SlurmClient`, as a recorded attempt: :mod:`air_hpc.ownership.attempts`);
  the script itself forwards the signal and requeues on the exit-code contract.
- :class:`SubmititSlurmExecutor` (``submitit``): submitit's SlurmExecutor with
  the same resources and selection; submitit requeues through
  :class:`~air_hpc.runtime.entry.TrainingEntry`'s ``checkpoint``, on
  ``resilience.signal`` like the other two. submitit runs ``sbatch`` itself,
  outside our client, with this process's environment (so ``SLURM_CONF`` must be exported).
- :class:`SubmititLocalExecutor` (``local``): submitit's LocalExecutor on this
  machine (one node); its controller is recorded by PID and start time.

Each one records its job in submissions.jsonl; :func:`air_hpc.launch.submit.submit`
holds the run's owner lock around it.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import submitit

from air_hpc.config.models import JobConfig
from air_hpc.launch.plan import Plan
from air_hpc.ownership.attempts import sbatch_recorded
from air_hpc.ownership.local_job import ProcessIdentity, RecordExit
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import Executor, record_submission
from air_hpc.render import job_environment
from air_hpc.render.quoting import shell_quote
from air_hpc.runtime.entry import TrainingEntry
from air_hpc.slurm.client import SlurmClient

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

    def launch(self, plan: Plan, run_dir: RunDir) -> Launched: ...


@dataclass(frozen=True)
class SbatchExecutor:
    client: SlurmClient
    name: Executor = "slurm"

    def launch(self, plan: Plan, run_dir: RunDir) -> Launched:
        return Launched(sbatch_recorded(self.client, run_dir, plan.spec.job_name))


@dataclass(frozen=True)
class SubmititSlurmExecutor:
    entry: EntryFactory = default_entry
    name: Executor = "submitit"

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


def _exports(env: dict[str, str]) -> list[str]:
    return [f"export {name}={shell_quote(value)}" for name, value in sorted(env.items())]


def _submitit_env(job: JobConfig, env: dict[str, str]) -> dict[str, str]:
    """The job's environment plus ``resilience.signal`` as submitit's own preemption signal on every rank."""
    return {**env, SUBMITIT_SIGNAL_ENV: job.resilience.signal}


def submitit_slurm_parameters(plan: Plan, run_dir: RunDir) -> dict[str, Any]:
    """submitit's SlurmExecutor parameters for the plan: the resources, nodes and signal our script would ask for.

    Writes the rank order to the run's hostfile when the plan pins one.
    """
    spec, job = plan.spec, plan.job
    setup = _exports(_submitit_env(job, dict(spec.env)))
    srun_args = ["--kill-on-bad-exit=1"]
    if spec.request.rank_hosts:
        hostfile = run_dir.hostfile
        hostfile.write_text("".join(f"{h}\n" for h in spec.request.rank_hosts))
        setup.append(f"export SLURM_HOSTFILE={shell_quote(str(hostfile))}")
        srun_args.append("--distribution=arbitrary")
    additional: dict[str, Any] = {
        "requeue": True,
        "open-mode": "append",
        "signal": f"{job.resilience.signal}@{spec.signal_lead_s}",  # submitit's own default is USR2
    }
    if spec.switches:
        additional["switches"] = spec.switches
    if spec.request.segment:
        additional["segment"] = spec.request.segment
    if spec.reservation:
        additional["reservation"] = spec.reservation
    params: dict[str, Any] = {
        "job_name": spec.job_name,
        "nodes": spec.nodes,
        "ntasks_per_node": spec.tasks_per_node,
        "cpus_per_task": spec.cpus_per_task,
        "time": spec.time_limit_min,
        "setup": setup,
        "srun_args": srun_args,
        "additional_parameters": additional,
    }
    optional = {
        "partition": spec.partition,
        "account": spec.account,
        "qos": spec.qos,
        "constraint": spec.constraint,
        "nodelist": spec.request.nodelist,
        "exclude": spec.request.exclude,
        "mem": f"{spec.mem_gb}GB" if spec.mem_gb else None,
        "gpus_per_node": spec.gpus_per_node or None,
        "exclusive": True if spec.exclusive else None,
    }
    params.update({k: v for k, v in optional.items() if v is not None})
    return params
