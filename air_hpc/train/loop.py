"""One optimizer step: micro-batches through Megatron's pipeline schedule, then the optimizer.

Data order depends only on ``consumed_samples`` (see :mod:`air_hpc.data.blend`),
so a step is a pure function of the model state and that counter: the basis of
bit-exact resume. The next step's micro-batches are read ahead while this one computes.
"""

import functools
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from air_hpc.config.models import JobConfig
from air_hpc.data.blend import BlendedSamples
from air_hpc.train.data import micro_batch_indices
from air_hpc.train.model import Model
from air_hpc.train.parallel import ParallelContext

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepResult:
    """What one step produced; ``loss`` is the DP-averaged loss on the last stage, NaN elsewhere."""

    loss: float
    lr: float
    grad_norm: float
    step_time_s: float
    loader_time_s: float


class StepRunner:
    """Runs training steps for one rank; holds nothing that changes between steps but timers."""

    def __init__(self, job: JobConfig, ctx: ParallelContext, model: Model, samples: BlendedSamples) -> None:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        self.job = job
        self.ctx = ctx
        self.model = model
        self.samples = samples
        self.device = torch.device("cuda", torch.cuda.current_device()) if job.hardware.device == "cuda" else None
        t = job.train
        self.micro_batches = t.global_batch_size // (t.micro_batch_size * ctx.layout.dp)
        self._forward_backward = get_forward_backward_func(pp_size=ctx.layout.pp, vp_size=ctx.layout.vpp)
        self._loader_s = 0.0

    def _micro_batches(self, consumed_samples: int) -> Iterator[dict[str, torch.Tensor]]:
        t, ctx = self.job.train, self.ctx
        for micro in range(self.micro_batches):
            started = time.perf_counter()
            indices = micro_batch_indices(consumed_samples, micro, t.micro_batch_size, ctx.dp_rank, ctx.layout.dp)
            tokens = torch.from_numpy(self.samples.batch(indices))
            if self.device is not None:
                tokens = tokens.to(self.device, non_blocking=True)
            batch = {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]}
            self._loader_s += time.perf_counter() - started
            yield batch

    def _read_ahead(self, next_consumed: int) -> None:
        """Have the next step's micro-batches read in the background while this step computes."""
        ctx, t = self.ctx, self.job.train
        if any(ctx.chunk_is_first(c) or ctx.chunk_is_last(c) for c in range(ctx.chunks)):
            batches = [
                micro_batch_indices(next_consumed, micro, t.micro_batch_size, ctx.dp_rank, ctx.layout.dp)
                for micro in range(self.micro_batches)
            ]
            self.samples.prefetch(batches, done_before=next_consumed - t.global_batch_size)

    def _data_iterators(self, consumed_samples: int) -> Any:
        ctx = self.ctx
        iterators = [
            self._micro_batches(consumed_samples) if ctx.chunk_is_first(c) or ctx.chunk_is_last(c) else None
            for c in range(ctx.chunks)
        ]
        return iterators if ctx.chunks > 1 else iterators[0]

    def _forward_step(self, data_iterator: Iterator[dict[str, torch.Tensor]] | None, model: Any) -> Any:
        seq_len = self.job.model.seq_len
        batch = next(data_iterator) if data_iterator is not None else None
        input_ids = batch["input_ids"] if batch is not None else None
        labels = batch["labels"] if batch is not None else None
        position_ids = (
            torch.arange(seq_len, device=input_ids.device).unsqueeze(0).expand_as(input_ids)
            if input_ids is not None
            else None
        )
        output = model(input_ids, position_ids, None, labels=labels)
        return output, functools.partial(_loss, self.device)

    def step(self, consumed_samples: int) -> StepResult:
        """Train one step on the global batch that starts at ``consumed_samples``."""
        started = time.perf_counter()
        self._loader_s = 0.0
        model, t = self.model, self.job.train
        self._read_ahead(consumed_samples + t.global_batch_size)
        for chunk in model.chunks:
            chunk.zero_grad_buffer()
        model.optimizer.zero_grad()
        lr = float(model.optimizer.param_groups[0]["lr"])
        losses = self._forward_backward(
            forward_step_func=self._forward_step,
            data_iterator=self._data_iterators(consumed_samples),
            model=model.chunks if self.ctx.chunks > 1 else model.chunks[0],
            num_microbatches=self.micro_batches,
            seq_length=self.job.model.seq_len,
            micro_batch_size=t.micro_batch_size,
            forward_only=False,
        )
        _, grad_norm, _ = model.optimizer.step()
        model.scheduler.step(increment=1)
        loss = self._reduce_loss(losses)
        return StepResult(
            loss=loss,
            lr=lr,
            grad_norm=float(grad_norm) if grad_norm is not None else float("nan"),
            step_time_s=time.perf_counter() - started,
            loader_time_s=self._loader_s,
        )

    def _reduce_loss(self, losses: list[dict[str, torch.Tensor]]) -> float:
        """Token-weighted mean over micro-batches and DP ranks (gloo has no AVG)."""
        if not self.ctx.is_last_stage:
            return float("nan")
        total = torch.stack([entry["lm loss"] for entry in losses]).sum(dim=0)
        if self.ctx.layout.dp > 1:
            torch.distributed.all_reduce(total, group=self.ctx.dp_group)
        return float(total[0] / total[1])


def _loss(device: torch.device | None, output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """Sum of per-token losses, token count, and a detached copy for logging.

    The schedule divides the returned loss in place, hence the clone.
    """
    loss_sum = output.float().sum()
    num_tokens = torch.tensor(output.numel(), dtype=torch.int, device=device)
    logged = torch.stack([loss_sum.detach().clone(), num_tokens.detach().to(torch.float32)])
    return loss_sum, num_tokens, {"lm loss": logged}
