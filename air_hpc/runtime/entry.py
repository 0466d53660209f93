"""The job's entry point on every rank: the same object under sbatch+srun, submitit Slurm and local.

:class:`TrainingEntry` is a submitit ``Checkpointable``: it pickles as just the
run directory, so a requeued job re-reads ``job.json`` and resumes from the
latest complete checkpoint (resume is the normal start).
"""

import contextlib
import logging
import os
import signal
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import submitit

from air_hpc.digits import ascii_int
from air_hpc.errors import AirHpcError, ConfigError
from air_hpc.exitcodes import ExitCode
from air_hpc.health.guard import rank_guard, record_verdict
from air_hpc.ownership.attempts import fence_settled
from air_hpc.records.events import CrashLoop, EventLog, RankFailed, read_events
from air_hpc.records.generation import generation, generation_dir
from air_hpc.records.rundir import RunDir
from air_hpc.resilience.progress import CrashLoopError, check_progress
from air_hpc.runtime.rendezvous import master_port
from air_hpc.runtime.standby import STARTED_AT_ENV
from air_hpc.slurm import env as slurm_env
from air_hpc.slurm.env import SlurmEnv
from air_hpc.train.parallel import DistEnv, apply_rank_order

log = logging.getLogger(__name__)


def dist_env_from_slurm(environ: Mapping[str, str]) -> DistEnv:
    """Rank, world and rendezvous of an ``srun`` task, from its ``SLURM_*`` (and ``MASTER_*``) variables."""
    try:
        slurm = SlurmEnv.from_environ(environ)
    except AirHpcError as exc:
        raise ConfigError(f"launch: {exc}") from None
    if slurm.procid is None or slurm.ntasks is None or slurm.localid is None or slurm.job_id is None:
        task = (
            (slurm_env.PROCID, slurm.procid),
            (slurm_env.NTASKS, slurm.ntasks),
            (slurm_env.LOCALID, slurm.localid),
            (slurm_env.JOB_ID, slurm.job_id),
        )
        unset = next(var for var, value in task if value is None)
        raise ConfigError(f"launch: {unset} is not set; run this under srun inside a Slurm job")
    job_id = ascii_int(slurm.job_id)
    if job_id is None:
        raise ConfigError(f"launch: {slurm_env.JOB_ID}={slurm.job_id!r} is not a job id")
    master = environ.get("MASTER_ADDR") or (slurm.nodelist[0] if slurm.nodelist else "")
    if not master:
        raise ConfigError(f"launch: neither MASTER_ADDR nor {slurm_env.JOB_NODELIST[0]} is set")
    port = int(environ["MASTER_PORT"]) if environ.get("MASTER_PORT") else master_port(job_id, slurm.restart_count)
    hostname = slurm.nodename or socket.gethostname()
    return DistEnv(slurm.procid, slurm.ntasks, slurm.localid, master, port, hostname)


def dist_env_from_submitit(environ: Mapping[str, str]) -> DistEnv:
    """submitit's ranks, with our port derivation: submitit draws one from 20000-60000, often an ephemeral port."""
    dist = submitit.helpers.TorchDistributedEnvironment()
    job_id = ascii_int(str(submitit.JobEnvironment().job_id))
    slurm = SlurmEnv.from_environ(environ)
    port = (
        dist.master_port if environ.get("MASTER_PORT") or job_id is None else master_port(job_id, slurm.restart_count)
    )
    hostname = slurm.nodename or socket.gethostname()
    return DistEnv(dist.rank, dist.world_size, dist.local_rank, dist.master_addr, port, hostname)


def current_dist_env(environ: Mapping[str, str]) -> DistEnv:
    """Under submitit ask submitit; under a bare ``srun`` read Slurm's variables; then apply the rank order."""
    env = dist_env_from_submitit(environ) if environ.get("SUBMITIT_EXECUTOR") else dist_env_from_slurm(environ)
    hostfile = SlurmEnv.from_environ(environ).hostfile  # the placement's rank order, one host per rank
    if hostfile is None:
        return env
    try:
        hosts = [line.strip() for line in hostfile.read_text().splitlines() if line.strip()]
    except OSError as exc:
        raise ConfigError(f"{slurm_env.HOSTFILE}={hostfile}: cannot read the rank order: {exc}") from None
    return apply_rank_order(env, hosts)


class TrainingEntry(submitit.helpers.Checkpointable):
    """Train the run in ``run_dir`` on this rank; returns the run summary, raises AirHpcError on failure."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)

    def __call__(self) -> Any:
        from air_hpc.train import metrics, parallel, trainer
        from air_hpc.train.startup import StartupClock, pause_gc, process_start_s, resume_gc

        clock = StartupClock(_start_s(process_start_s))
        clock.mark("launch")
        run_dir = RunDir(self.run_dir)
        fence_settled(run_dir, os.environ)  # a job that does not own the run directory writes nothing there
        job = run_dir.read_job()
        for key, value in job.env.items():
            os.environ.setdefault(key, value)
        stop = trainer.arm_stop(job)
        trainer.validate(job)
        env = current_dist_env(os.environ)
        stop.announce_armed(generation_dir(run_dir, generation(os.environ)), env.rank, job.resilience.signal)
        restarts = SlurmEnv.from_environ(os.environ).restart_count
        metrics.warn_once_per_job(env.rank, restarts, on_cpu=job.hardware.device == "cpu", environ=os.environ)
        _stop_a_crash_loop(job.resilience.max_no_progress_restarts, run_dir, env.rank)
        handler = metrics.setup_rank_logging(run_dir.rank_log(env.rank), env.rank)
        pause_gc()  # under submitit or a test (``__main__`` paused it already); the trainer resumes it after the build
        try:
            log.info("rank %d of %d on %s (local rank %d)", env.rank, env.world_size, env.hostname, env.local_rank)
            on_cpu = job.hardware.device == "cpu"
            _apply_thread_limit(os.environ)
            from air_hpc.backend import megatron_compat

            megatron_compat.import_megatron()
            clock.mark("imports")
            with contextlib.ExitStack() as stack:
                if on_cpu:
                    stack.enter_context(megatron_compat.cpu_patched())
                else:
                    import torch

                    # One GPU per rank: all of the node's GPUs visible, or only the task's own (--gpus-per-task).
                    torch.cuda.set_device(env.local_rank % torch.cuda.device_count())
                heartbeat = stack.enter_context(
                    rank_guard(job, run_dir, env.rank, env.world_size, env.hostname, os.environ)
                )
                clock.mark("preflight")
                backend: parallel.Backend = "gloo" if on_cpu else "nccl"
                ctx = stack.enter_context(parallel.distributed(env, job.layout, backend, job.train.dist_timeout_s))
                clock.mark("rendezvous")
                summary = trainer.train(job, run_dir, ctx, heartbeat, stop, clock)
            if summary.exit_code != ExitCode.OK:
                record_verdict(run_dir, os.environ, summary.exit_code)
            if summary.exit_code == ExitCode.REQUEUE and os.environ.get("SUBMITIT_EXECUTOR"):
                stop.uninstall()
                _requeue_through_submitit(env.rank)
            return summary
        except AirHpcError as exc:  # already one line that says what and where
            log.error("rank %d failed: %s", env.rank, exc)
            raise
        except BaseException as exc:  # torch's CheckpointException is a BaseException
            _record_crash(run_dir, env, exc)
            raise
        finally:
            resume_gc()  # when the start failed before the trainer resumed it
            logging.getLogger().removeHandler(handler)
            handler.close()

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        """Requeue as a fresh entry on the same run directory; the trainer resumes from its checkpoints."""
        return submitit.helpers.DelayedSubmission(TrainingEntry(self.run_dir))


def _start_s(process_start_s: Callable[[], float]) -> float:
    """Where this rank's start-up clock begins: its process's creation, or a promoted warm standby's go."""
    promoted_at = os.environ.get(STARTED_AT_ENV)
    return float(promoted_at) if promoted_at else process_start_s()


def _stop_a_crash_loop(limit: int, run_dir: RunDir, rank: int) -> None:
    """Raise CrashLoopError (on every rank alike) when ``limit`` restarts in a row saved nothing."""
    current = generation(os.environ)
    why = check_progress(read_events(run_dir.events), current, limit)
    if why is None:
        return
    if rank == 0:
        EventLog(run_dir.events).emit(CrashLoop(generation=current, why=why))
    record_verdict(run_dir, os.environ, ExitCode.CRASH_LOOP)
    raise CrashLoopError(why)


def _record_crash(run_dir: RunDir, env: DistEnv, exc: BaseException) -> None:
    """A ``rank_failed`` event naming the exception, so ``status`` and ``report`` say why the start crashed.

    torch's distributed checkpoint gathers each rank's failure into one exception (``failures``) whose
    own text is only the list of ranks: name this rank's failure (else the first) instead.
    """
    if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)):
        return
    log.exception("rank %d failed", env.rank)
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        cause = failures.get(env.rank, next(iter(failures.values())))  # (exception, stack summary)
        exc = cause[0] if isinstance(cause, tuple) and cause and isinstance(cause[0], BaseException) else exc
    first_line = next(iter(str(exc).strip().splitlines()), "")
    error = f"{type(exc).__name__}: {first_line}" if first_line else type(exc).__name__
    try:
        EventLog(run_dir.events).emit(
            RankFailed(rank=env.rank, node=env.hostname, generation=generation(os.environ), error=error[:500])
        )
    except OSError as write_error:  # the crash itself may be a full disk: the rank log has the traceback
        log.warning("rank %d: could not record the crash in %s: %s", env.rank, run_dir.events, write_error)


def _requeue_through_submitit(rank: int) -> None:
    """Hand the stop to submitit now that the checkpoint is saved and the process groups are gone.

    The trainer's stop handler stood in for submitit's while training; raising
    submitit's preemption signal again runs submitit's own handler: on rank 0 it
    pickles :meth:`TrainingEntry.checkpoint` and requeues (``scontrol requeue``
    on Slurm, exit 144 under the LocalExecutor), elsewhere it only logs.
    """
    log.info("rank %d: checkpoint saved; handing the requeue to submitit", rank)
    signal.raise_signal(submitit.JobEnvironment._usr_sig())


def _apply_thread_limit(environ: Mapping[str, str]) -> None:
    """Honour OMP_NUM_THREADS even when torch was imported before the job's environment was applied."""
    threads = ascii_int(environ.get("OMP_NUM_THREADS", ""))
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
