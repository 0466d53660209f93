"""The training run of one rank: validate, build, resume, loop over steps, checkpoint, stop.

:func:`validate` runs before any process group starts so that a bad config or
data file is one line and exit code 2 on every rank, not a hang in a collective.

Resume is the normal start: every run asks for the newest complete checkpoint
(rank 0 picks it, all ranks load it) and continues from its step and consumed
samples; the first run simply finds none. At each step boundary the ranks agree
(one all-reduce) whether a stop signal arrived or the time limit is near; if so
they save synchronously and return :attr:`ExitCode.REQUEUE`.
"""

import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from air_hpc.config.models import JobConfig
from air_hpc.exitcodes import ExitCode
from air_hpc.health.heartbeat import Heartbeat
from air_hpc.records.rundir import RunDir
from air_hpc.train import metrics as metrics_mod
from air_hpc.train import tb_log
from air_hpc.train.data import CorpusInfo, TokenSamples, check_for_training
from air_hpc.train.parallel import ParallelContext

if TYPE_CHECKING:
    from air_hpc.records.events import EventLog
    from air_hpc.resilience.signals import StopRequest
    from air_hpc.train.startup import StartupClock
    from air_hpc.train.straggler_watch import StragglerWatch

log = logging.getLogger(__name__)

#: Signals that ask for a checkpoint and a requeue besides ``resilience.signal``.
ALWAYS_STOP_ON = ("TERM",)


def arm_stop(job: JobConfig) -> "StopRequest":
    """Handle the configured stop signal and SIGTERM by setting a flag (main thread only)."""
    from air_hpc.resilience.signals import StopRequest

    return StopRequest.install([job.resilience.signal, *ALWAYS_STOP_ON])


def validate(job: JobConfig) -> CorpusInfo:
    """Checks beyond the config's own cross-field rules: the data file against the model, optional packages."""
    if job.observe.tensorboard:
        tb_log.check_available()
    return check_for_training(job.data.path, job.model.seq_len, job.model.vocab_size)


@dataclass(frozen=True)
class RunSummary:
    first_step: int
    last_step: int
    final_loss: float
    exit_code: ExitCode
    stop_reason: str | None = None


def train(
    job: JobConfig,
    run_dir: RunDir,
    ctx: ParallelContext,
    heartbeat: Heartbeat | None = None,
    stop: "StopRequest | None" = None,
    clock: "StartupClock | None" = None,
) -> RunSummary:
    """Train from the latest checkpoint (or step 1) to ``train.steps``; the caller owns the process groups.

    ``heartbeat`` hears of every step and checkpoint, so the watchdog can tell a slow step from a hung one.
    ``stop`` is the caller's armed stop flag: installed early, it also catches a signal that arrives
    during setup, and one that arrives after the last step does no harm. Without one, the stop
    signals are armed here for the duration of the call.
    """
    from air_hpc.records.events import EventLog
    from air_hpc.resilience.checkpointer import Checkpointer
    from air_hpc.resilience.interval import INTERVAL_KIND, CheckpointSchedule
    from air_hpc.resilience.signals import Deadline, agree_stop
    from air_hpc.resilience.store import CheckpointStore
    from air_hpc.train import model as model_mod
    from air_hpc.train import parallel
    from air_hpc.train.loop import StepRunner

    t = job.train
    parallel.seed(ctx, t.seed)
    model = model_mod.build(job, ctx)
    _mark(clock, "model")
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
    )
    if heartbeat is not None:
        heartbeat.beat("checkpoint", 0)
    loaded = checkpoints.resume(model.chunks, model.optimizer, model.scheduler)
    first_step = 1 if loaded is None else loaded.step + 1
    consumed = 0 if loaded is None else int(loaded.extra["consumed_samples"])
    if loaded is not None:
        log.info("resumed from step %d (%d samples consumed)", loaded.step, consumed)
    _mark(clock, "resume")

    samples = TokenSamples(job.data.path, job.model.seq_len, t.seed)
    runner = StepRunner(job, ctx, model, samples)
    writer = (
        metrics_mod.MetricsWriter(run_dir.metrics, keep_through_step=first_step - 1) if ctx.writes_metrics else None
    )
    board = (
        tb_log.TensorBoardLog(run_dir.tensorboard, first_step, loaded.step if loaded is not None else None)
        if job.observe.tensorboard and ctx.writes_metrics
        else None
    )
    mfu_per_token = _mfu_factor(job)
    tokens_per_step = t.global_batch_size * job.model.seq_len
    own_stop = stop is None
    if stop is None:
        stop = arm_stop(job)
    deadline = Deadline.from_env(
        job.resources.time_limit_min, job.resilience.time_margin_s, submissions=run_dir.submissions
    )
    schedule = CheckpointSchedule(job.checkpoint.interval_steps, job.resilience.mtbf_h)
    loss = math.nan
    watch = _straggler_watch(job, run_dir, ctx, events)
    _mark(clock, "data")
    started = time.perf_counter()

    def save(step: int, sync: bool, reason: str, supersede: bool = False) -> None:
        if heartbeat is not None:
            heartbeat.beat("checkpoint", step)
        if board is not None:
            board.checkpoint(step, reason)
        extra = {"consumed_samples": consumed}
        checkpoints.save(
            step, model.chunks, model.optimizer, model.scheduler, extra, sync=sync, reason=reason, supersede=supersede
        )

    try:
        for step in range(first_step, t.steps + 1):
            if heartbeat is not None:
                heartbeat.beat("step", step)
            if watch is not None:
                watch.begin()
            result = runner.step(consumed)
            if watch is not None:
                watch.end(step)
            consumed += t.global_batch_size
            loss = result.loss
            if clock is not None and step == first_step:
                clock.mark("first_step")
                _record_startup(clock, events, ctx.rank, step)
            tokens_per_s = tokens_per_step / result.step_time_s
            if writer is not None:
                writer.write(
                    metrics_mod.StepMetrics(
                        step=step,
                        loss=result.loss,
                        lr=result.lr,
                        grad_norm=result.grad_norm,
                        tokens_per_s=tokens_per_s,
                        step_time_s=result.step_time_s,
                        mfu=tokens_per_s * mfu_per_token if mfu_per_token else None,
                        resumed_from=loaded.step if loaded is not None and step == first_step else None,
                        rng_restored=loaded.rng_restored if loaded is not None and step == first_step else None,
                    )
                )
            if board is not None:
                board.step(step, result.loss, result.lr, tokens_per_s, result.grad_norm, result.step_time_s)
            if step % t.log_interval == 0:
                shown_loss = result.loss if ctx.is_last_stage else None
                log.info(
                    "%s",
                    metrics_mod.step_line(
                        step,
                        t.steps,
                        shown_loss,
                        result.lr,
                        result.grad_norm,
                        result.step_time_s,
                        result.loader_time_s,
                    ),
                )
            checkpoints.poll()
            reason = agree_stop(stop, deadline)
            if reason is not None:
                log.warning("stopping at step %d (%s): saving, then asking for a requeue", step, reason)
                if ctx.rank == 0:
                    events.emit("stop", step=step, reason=reason, signal=stop.signal_name)
                if board is not None:
                    board.stop(step, reason)
                save(step, sync=True, reason=reason, supersede=True)
                checkpoints.close()
                return RunSummary(first_step, step, loss, ExitCode.REQUEUE, reason)
            if schedule.due(step, result.step_time_s) and step < t.steps:
                began = time.perf_counter()
                save(step, sync=False, reason="interval")
                choice = schedule.saved(step, time.perf_counter() - began)
                if choice is not None and ctx.rank == 0:
                    events.emit(INTERVAL_KIND, step=step, **choice.to_event())
        if first_step <= t.steps:
            save(t.steps, sync=True, reason="final")
        checkpoints.close()
    finally:
        if watch is not None:
            watch.close()
        if own_stop:
            stop.uninstall()
        if writer is not None:
            writer.close()
        if board is not None:
            board.close()
        samples.close()
    log.info("trained steps %d..%d in %.1f s", first_step, t.steps, time.perf_counter() - started)
    return RunSummary(first_step, t.steps, loss, ExitCode.OK)


def _straggler_watch(
    job: JobConfig, run_dir: RunDir, ctx: ParallelContext, events: "EventLog"
) -> "StragglerWatch | None":
    """This rank's part of the straggler check; None when it is off or there is only one rank."""
    if job.health.straggler_window_steps == 0 or ctx.layout.world_size < 2:
        return None
    import socket

    from air_hpc.health.busy import BusyMeter
    from air_hpc.train.straggler_watch import StragglerWatch

    host = ctx.hostname or socket.gethostname()
    return StragglerWatch(job.health, ctx.rank, host, events, run_dir.bad_nodes, BusyMeter())


def _mark(clock: "StartupClock | None", phase: str) -> None:
    if clock is not None:
        clock.mark(phase)


def _record_startup(clock: "StartupClock", events: "EventLog", rank: int, step: int) -> None:
    """Gather every rank's start-up phases (one collective); rank 0 writes them as one event."""
    from air_hpc.train.collectives import gather_floats
    from air_hpc.train.startup import EVENT_KIND, startup_event

    per_rank = gather_floats(clock.vector())
    if rank == 0:
        fields = startup_event(per_rank, step)
        events.emit(EVENT_KIND, **fields)
        log.info(
            "start-up: %.1f s to the first step (slowest rank %d)", fields["to_first_step_s"], fields["slowest_rank"]
        )


def _mfu_factor(job: JobConfig) -> float | None:
    """MFU per token/s on GPUs with a known peak; None on CPU."""
    if job.hardware.device != "cuda":
        return None
    import torch

    peak = metrics_mod.peak_flops(torch.cuda.get_device_name())
    if peak is None:
        return None
    return metrics_mod.flops_per_token(job.model) / (peak * job.resources.world_size)
