"""The training run of one rank: validate, build, resume, loop over steps, checkpoint, stop.

:func:`validate` runs before any process group starts so that a bad config or
data file is one line and exit code 2 on every rank, not a hang in a collective.

Resume is the normal start: every run asks for the newest complete checkpoint
(rank 0 picks it, all ranks load it) and continues from its step and consumed
samples; the first run simply finds none. At each step boundary the ranks agree
(one all-reduce) whether a stop signal arrived or the time limit is near; if so
they save synchronously and return :attr:`ExitCode.REQUEUE`.
"""

import functools
import logging
import math
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from air_hpc.backend.collectives import gather_floats
from air_hpc.config.models import JobConfig
from air_hpc.data.blend import BlendedSamples, BlendPlan, check_for_training, open_samples
from air_hpc.exitcodes import ExitCode
from air_hpc.health.busy import BusyMeter
from air_hpc.health.heartbeat import Heartbeat
from air_hpc.records.events import EventLog, Stop
from air_hpc.records.rundir import RunDir
from air_hpc.resilience.interval import CheckpointSchedule, persistent_mtbf_h
from air_hpc.resilience.signals import Deadline, StopRequest, agree_stop
from air_hpc.resilience.store import CheckpointStore
from air_hpc.train import metrics as metrics_mod
from air_hpc.train import parallel, tb_log
from air_hpc.train.parallel import ParallelContext
from air_hpc.train.startup import StartupClock, resume_gc, startup_event
from air_hpc.train.straggler_watch import StragglerWatch

if TYPE_CHECKING:
    from air_hpc.resilience.checkpointer import Checkpointer
    from air_hpc.resilience.memory import MemorySnapshots
    from air_hpc.resilience.state import Loaded
    from air_hpc.train.loop import StepResult
    from air_hpc.train.model import Model

log = logging.getLogger(__name__)

#: Signals that ask for a checkpoint and a requeue besides ``resilience.signal``.
ALWAYS_STOP_ON = ("TERM",)


def arm_stop(job: JobConfig) -> StopRequest:
    """Handle the configured stop signal and SIGTERM by setting a flag (main thread only)."""
    return StopRequest.install([job.resilience.signal, *ALWAYS_STOP_ON])


def validate(job: JobConfig) -> BlendPlan:
    """Checks beyond the config's own cross-field rules: the data against the model, optional packages."""
    if job.observe.tensorboard:
        tb_log.check_available()
    return check_for_training(job.data, job.model.seq_len, job.model.vocab_size)


@dataclass(frozen=True)
class RunSummary:
    first_step: int
    last_step: int
    final_loss: float
    exit_code: ExitCode
    stop_reason: str | None = None


@dataclass(frozen=True)
class _Start:
    """Where this run starts: after the resumed checkpoint, or at step 1."""

    loaded: "Loaded | None"
    first_step: int
    consumed: int
    newest_checkpoint: int | None = None
    """The newest committed persistent checkpoint when ``loaded`` is an in-memory snapshot (else None)."""
    from_memory: bool = False


def train(
    job: JobConfig,
    run_dir: RunDir,
    ctx: ParallelContext,
    heartbeat: Heartbeat | None = None,
    stop: StopRequest | None = None,
    clock: StartupClock | None = None,
) -> RunSummary:
    """Train from the latest checkpoint (or step 1) to ``train.steps``; the caller owns the process groups.

    ``heartbeat`` hears of every step and checkpoint, so the watchdog can tell a slow step from a hung one.
    ``stop`` is the caller's armed stop flag: installed early, it also catches a signal that arrives
    during setup, and one that arrives after the last step does no harm. Without one, the stop
    signals are armed here for the duration of the call.

    Phases: build the model, resume, open the step loop's files and flags, run the steps. The
    checkpointer is closed on every way out: after an error without a collective (:meth:`abort`).
    """
    # torch loads with these, inside the start-up clock's "imports" phase (entry imports this module first)
    from air_hpc.resilience.checkpointer import Checkpointer
    from air_hpc.train import model as model_mod

    parallel.seed(ctx, job.train.seed)
    model = model_mod.build(job, ctx)
    _mark(clock, "model")
    resume_gc()  # paused by the rank's entry for the imports and the build (see startup.pause_gc)
    events = EventLog(run_dir.events)
    checkpoints = Checkpointer(
        CheckpointStore(run_dir.checkpoints, job.checkpoint.keep_last, job.checkpoint.keep_every),
        events,
        job.checkpoint.async_save,
        layout=ctx.layout,
        device=job.hardware.device,
        verify=job.checkpoint.verify,
        async_wait_s=job.checkpoint.async_wait_s,
        allow_fresh_start=job.checkpoint.allow_fresh_start,
        progress=None if heartbeat is None else functools.partial(_still_in_phase, heartbeat),
    )
    if heartbeat is not None:
        heartbeat.beat("load", 0)
    snapshots = _open_snapshots(job, ctx, events)
    start = _resume(checkpoints, model, snapshots, job.hardware.device)
    _mark(clock, "resume")
    loop = _StepLoop(job, run_dir, ctx, model, checkpoints, events, start, heartbeat, clock, stop, snapshots)
    _mark(clock, "data")
    started = time.perf_counter()
    try:
        with checkpoints:
            summary = loop.run()
            if snapshots is not None:
                snapshots.wait()
    finally:
        loop.close()
        if snapshots is not None:
            snapshots.close()
    _log_sources(loop.samples, loop.consumed, f"after step {summary.last_step}:")
    if summary.exit_code == ExitCode.OK:
        log.info("trained steps %d..%d in %.1f s", start.first_step, job.train.steps, time.perf_counter() - started)
    return summary


def _open_snapshots(job: JobConfig, ctx: ParallelContext, events: EventLog) -> "MemorySnapshots | None":
    """This rank's in-memory snapshots when ``checkpoint.memory_interval_steps`` is set (collective)."""
    if not job.checkpoint.memory_interval_steps:
        return None
    from air_hpc.resilience.memory import open_snapshots

    host = ctx.hostname or socket.gethostname()
    return open_snapshots(job.checkpoint.memory_interval_steps, ctx.layout, host, events, job.cluster.topology_file)


def _resume(checkpoints: "Checkpointer", model: "Model", snapshots: "MemorySnapshots | None", device: str) -> _Start:
    """Load the newest in-memory snapshot, else the newest good checkpoint (collective); resume is the normal start.

    A snapshot older than the newest committed checkpoint is not used (a requeue's checkpoint is newer).
    """
    loaded = newest = None
    if snapshots is not None:
        newest = max(checkpoints.store.committed_steps(), default=None) if checkpoints.rank == 0 else None
        newest = checkpoints.comm.broadcast_from_0(newest)
        loaded = snapshots.restore(model.state(), newest, device)
    from_memory = loaded is not None
    if loaded is None:
        loaded = checkpoints.resume(model.state())
    if loaded is None:
        return _Start(None, 1, 0)
    consumed = int(loaded.extra["consumed_samples"])
    log.info("resumed from step %d (%d samples consumed)", loaded.step, consumed)
    return _Start(loaded, loaded.step + 1, consumed, newest if from_memory else None, from_memory)


class _StepLoop:
    """One rank's steps from the start: step, report, agree on stopping, checkpoint.

    Opens what the steps write to (metrics, TensorBoard, the data file) and arms the stop
    flag unless the caller did; :meth:`close` releases them.
    """

    def __init__(
        self,
        job: JobConfig,
        run_dir: RunDir,
        ctx: ParallelContext,
        model: "Model",
        checkpoints: "Checkpointer",
        events: EventLog,
        start: _Start,
        heartbeat: Heartbeat | None,
        clock: StartupClock | None,
        stop: StopRequest | None,
        snapshots: "MemorySnapshots | None" = None,
    ) -> None:
        from air_hpc.train.loop import StepRunner  # torch, as in train()

        self.job, self.ctx, self.model, self.events = job, ctx, model, events
        self.checkpoints, self.start, self.heartbeat, self.clock = checkpoints, start, heartbeat, clock
        self.snapshots = snapshots
        self.consumed = start.consumed
        self.loss = math.nan
        self.samples = open_samples(job)
        _log_sources(self.samples, start.consumed, "starting with")
        self.runner = StepRunner(job, ctx, model, self.samples)
        keep = start.first_step - 1
        self.writer = metrics_mod.MetricsWriter(run_dir.metrics, keep_through_step=keep) if ctx.writes_metrics else None
        resumed_from = start.loaded.step if start.loaded is not None else None
        self.board = (
            tb_log.TensorBoardLog(run_dir.tensorboard, start.first_step, resumed_from)
            if job.observe.tensorboard and ctx.writes_metrics
            else None
        )
        self.mfu_per_token = _mfu_factor(job)
        self.tokens_per_step = job.train.global_batch_size * job.model.seq_len
        self.own_stop = stop is None
        self.stop = stop if stop is not None else arm_stop(job)
        self.deadline = Deadline.from_env(
            job.resources.time_limit_min, job.resilience.time_margin_s, submissions=run_dir.submissions
        )
        self.schedule = CheckpointSchedule(job.checkpoint.interval_steps, _persistent_mtbf_h(job, snapshots))
        self.watch = _straggler_watch(job, run_dir, ctx, events)

    def run(self) -> RunSummary:
        steps = self.job.train.steps
        start = self.start
        if start.from_memory and self.schedule.missed(start.first_step - 1, start.newest_checkpoint, steps):
            # A periodic save the failure interrupted (or that it struck before) is not skipped: a later requeue
            # would otherwise go back a whole interval more (or to step 1).
            log.info(
                "saving step %d: the periodic checkpoint due since step %s is missing",
                start.first_step - 1,
                start.newest_checkpoint,
            )
            self._save(start.first_step - 1, sync=False, reason="catch_up")
        for step in range(self.start.first_step, steps + 1):
            result = self._step(step)
            self._report(step, result)
            self.checkpoints.poll()
            if self.snapshots is not None:
                training = self.model.state().at(consumed_samples=self.consumed)
                self.snapshots.after_step(step, training, self.job.hardware.device)
            reason = agree_stop(self.stop, self.deadline)
            if reason is not None:
                self._stop(step, reason)
                return RunSummary(self.start.first_step, step, self.loss, ExitCode.REQUEUE, reason)
            if self.schedule.due(step, result.step_time_s) and step < steps:
                began = time.perf_counter()
                self._save(step, sync=False, reason="interval")
                choice = self.schedule.saved(step, time.perf_counter() - began)
                if choice is not None and self.ctx.rank == 0:
                    self.events.emit(choice.to_event(step))
        if self.start.first_step <= steps:
            self._save(steps, sync=True, reason="final")
        return RunSummary(self.start.first_step, steps, self.loss, ExitCode.OK)

    def _step(self, step: int) -> "StepResult":
        if self.heartbeat is not None:
            self.heartbeat.beat("step", step)
        if self.watch is not None:
            self.watch.begin()
        result = self.runner.step(self.consumed)
        if self.watch is not None:
            self.watch.end(step)
        self.consumed += self.job.train.global_batch_size
        self.loss = result.loss
        if self.clock is not None and step == self.start.first_step:
            self.clock.mark("first_step")
            _record_startup(self.clock, self.events, self.ctx.rank, step)
        return result

    def _report(self, step: int, result: "StepResult") -> None:
        """metrics.jsonl, TensorBoard and, every ``log_interval`` steps, the log line."""
        tokens_per_s = self.tokens_per_step / result.step_time_s
        loaded = self.start.loaded if step == self.start.first_step else None
        if self.writer is not None:
            self.writer.write(
                metrics_mod.StepMetrics(
                    step=step,
                    loss=result.loss,
                    lr=result.lr,
                    grad_norm=result.grad_norm,
                    tokens_per_s=tokens_per_s,
                    step_time_s=result.step_time_s,
                    mfu=tokens_per_s * self.mfu_per_token if self.mfu_per_token else None,
                    resumed_from=loaded.step if loaded is not None else None,
                    rng_restored=loaded.rng_restored if loaded is not None else None,
                )
            )
        if self.board is not None:
            self.board.step(step, result.loss, result.lr, tokens_per_s, result.grad_norm, result.step_time_s)
        if step % self.job.train.log_interval == 0:
            shown_loss = result.loss if self.ctx.is_last_stage else None
            line = metrics_mod.step_line(
                step,
                self.job.train.steps,
                shown_loss,
                result.lr,
                result.grad_norm,
                result.step_time_s,
                result.loader_time_s,
            )
            log.info("%s", line)

    def _stop(self, step: int, reason: str) -> None:
        """The ranks agreed to stop: say so, then save synchronously, superseding an unfinished save."""
        log.warning("stopping at step %d (%s): saving, then asking for a requeue", step, reason)
        if self.ctx.rank == 0:
            self.events.emit(Stop(step=step, reason=reason, signal=self.stop.signal_name))
        if self.board is not None:
            self.board.stop(step, reason)
        self._save(step, sync=True, reason=reason, supersede=True)

    def _save(self, step: int, sync: bool, reason: str, supersede: bool = False) -> None:
        if self.heartbeat is not None:
            self.heartbeat.beat("sync_save" if sync or not self.checkpoints.async_save else "save", step)
        if self.board is not None:
            self.board.checkpoint(step, reason)
        training = self.model.state().at(consumed_samples=self.consumed)
        self.checkpoints.save(step, training, sync=sync, reason=reason, supersede=supersede)

    def close(self) -> None:
        if self.watch is not None:
            self.watch.close()
        if self.own_stop:
            self.stop.uninstall()
        if self.writer is not None:
            self.writer.close()
        if self.board is not None:
            self.board.close()
        self.samples.close()


def _log_sources(samples: BlendedSamples, consumed: int, when: str) -> None:
    """Samples drawn from each data source so far (the blend's schedule gives them without counting)."""
    counts = samples.source_counts(consumed)
    log.info("data %s %s", when, ", ".join(f"{key} {n} samples" for key, n in counts.items()))


def _persistent_mtbf_h(job: JobConfig, snapshots: "MemorySnapshots | None") -> float | None:
    """``resilience.mtbf_h`` as the persistent checkpoint sees it: in-memory snapshots absorb in-job failures."""
    mtbf_h = job.resilience.mtbf_h
    if mtbf_h is None:
        return None
    effective = persistent_mtbf_h(mtbf_h, snapshots is not None, job.resources.spare_nodes, job.resources.nodes)
    if effective != mtbf_h:
        log.info(
            "checkpoint interval: MTBF %g h for the persistent level (%g h, in-memory snapshots)", effective, mtbf_h
        )
    return effective


def _straggler_watch(job: JobConfig, run_dir: RunDir, ctx: ParallelContext, events: EventLog) -> StragglerWatch | None:
    """This rank's part of the straggler check; None when it is off or there is only one rank."""
    if job.health.straggler_window_steps == 0 or ctx.layout.world_size < 2:
        return None
    host = ctx.hostname or socket.gethostname()
    return StragglerWatch(job.health, ctx.rank, host, events, run_dir.bad_nodes, BusyMeter())


def _still_in_phase(heartbeat: Heartbeat) -> None:
    """Progress inside the current phase (a round of waiting for the writers that every rank answered)."""
    heartbeat.beat(heartbeat.last.phase)


def _mark(clock: StartupClock | None, phase: str) -> None:
    if clock is not None:
        clock.mark(phase)


def _record_startup(clock: StartupClock, events: EventLog, rank: int, step: int) -> None:
    """Gather every rank's start-up phases (one collective); rank 0 writes them as one event."""
    per_rank = gather_floats(clock.vector())
    if rank == 0:
        event = startup_event(per_rank, step)
        events.emit(event)
        log.info("start-up: %.1f s to the first step (slowest rank %d)", event.to_first_step_s, event.slowest_rank)


def _mfu_factor(job: JobConfig) -> float | None:
    """MFU per token/s on GPUs with a known peak; None on CPU."""
    if job.hardware.device != "cuda":
        return None
    import torch

    peak = metrics_mod.peak_flops(torch.cuda.get_device_name())
    if peak is None:
        return None
    return metrics_mod.flops_per_token(job.model) / (peak * job.resources.world_size)
