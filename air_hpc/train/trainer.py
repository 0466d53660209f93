"""The training run of one rank: validate, build, loop over steps, write metrics.

:func:`validate` runs before any process group starts so that a bad config or
data file is one line and exit code 2 on every rank, not a hang in a collective.
"""

import logging
import math
import time
from dataclasses import dataclass

from air_hpc.config.models import JobConfig
from air_hpc.exitcodes import ExitCode
from air_hpc.health.heartbeat import Heartbeat
from air_hpc.rundir import RunDir
from air_hpc.train import metrics as metrics_mod
from air_hpc.train.data import CorpusInfo, TokenSamples, check_for_training
from air_hpc.train.parallel import ParallelContext

log = logging.getLogger(__name__)


def validate(job: JobConfig) -> CorpusInfo:
    """Checks beyond the config's own cross-field rules: the data file against the model."""
    return check_for_training(job.data.path, job.model.seq_len, job.model.vocab_size)


@dataclass(frozen=True)
class RunSummary:
    first_step: int
    last_step: int
    final_loss: float
    exit_code: ExitCode


def train(job: JobConfig, run_dir: RunDir, ctx: ParallelContext, heartbeat: Heartbeat | None = None) -> RunSummary:
    """Train from the first step to ``train.steps``; the caller owns the process groups.

    ``heartbeat`` hears of every step, so the watchdog can tell a slow step from a hung one.
    """
    from air_hpc.train import model as model_mod
    from air_hpc.train import parallel
    from air_hpc.train.loop import StepRunner

    parallel.seed(ctx, job.train.seed)
    model = model_mod.build(job, ctx)
    samples = TokenSamples(job.data.path, job.model.seq_len, job.train.seed)
    runner = StepRunner(job, ctx, model, samples)
    writer = metrics_mod.MetricsWriter(run_dir.metrics) if ctx.writes_metrics else None
    mfu_per_token = _mfu_factor(job)
    tokens_per_step = job.train.global_batch_size * job.model.seq_len
    first_step, consumed = 1, 0
    loss = math.nan
    started = time.perf_counter()
    try:
        for step in range(first_step, job.train.steps + 1):
            if heartbeat is not None:
                heartbeat.beat("step", step)
            result = runner.step(consumed)
            consumed += job.train.global_batch_size
            loss = result.loss
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
                    )
                )
            if step % job.train.log_interval == 0:
                log.info(
                    "step %d/%d loss %.6f lr %.3g grad_norm %.4f %.3f s (loader %.1f ms)",
                    step,
                    job.train.steps,
                    result.loss,
                    result.lr,
                    result.grad_norm,
                    result.step_time_s,
                    result.loader_time_s * 1e3,
                )
    finally:
        if writer is not None:
            writer.close()
        samples.close()
    log.info("trained steps %d..%d in %.1f s", first_step, job.train.steps, time.perf_counter() - started)
    return RunSummary(first_step=first_step, last_step=job.train.steps, final_loss=loss, exit_code=ExitCode.OK)


def _mfu_factor(job: JobConfig) -> float | None:
    """MFU per token/s on GPUs with a known peak; None on CPU."""
    if job.hardware.device != "cuda":
        return None
    import torch

    peak = metrics_mod.peak_flops(torch.cuda.get_device_name())
    if peak is None:
        return None
    return metrics_mod.flops_per_token(job.model) / (peak * job.resources.world_size)
