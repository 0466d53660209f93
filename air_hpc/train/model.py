"""Megatron-core GPT, wrapped in Megatron DDP, with Megatron's optimizer and LR schedule.

One model chunk per virtual pipeline stage. The local layer spec runs on CPU; on GPU the
Transformer Engine spec is used when Transformer Engine is installed, else the local spec with
PyTorch's fused attention (:mod:`air_hpc.backend.sdpa_attention`).
"""

import importlib.util
import logging
from dataclasses import dataclass
from typing import Any

import torch

from air_hpc.config.models import JobConfig
from air_hpc.resilience.training_state import TrainingState
from air_hpc.train.parallel import ParallelContext

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Model:
    """What a training step needs: the DDP-wrapped chunks, the optimizer and its LR/WD schedule."""

    chunks: list[Any]
    optimizer: Any
    scheduler: Any
    config: Any

    def state(self) -> TrainingState:
        """What a checkpoint saves of this rank and a resume loads into it."""
        return TrainingState(tuple(self.chunks), self.optimizer, self.scheduler)

    @property
    def num_parameters(self) -> int:
        """Parameters held by this rank."""
        return sum(p.numel() for chunk in self.chunks for p in chunk.parameters())


def transformer_config(job: JobConfig) -> Any:
    """Megatron's config for this job; fusions only where their kernels exist on this machine."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    m, p = job.model, job.parallel
    on_cpu = job.hardware.device == "cpu"
    dtype = torch.bfloat16 if job.precision == "bf16" else torch.float32
    return TransformerConfig(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads,
        ffn_hidden_size=m.ffn_hidden_size or 4 * m.hidden_size,
        hidden_dropout=m.dropout,
        attention_dropout=m.dropout,
        init_method_std=m.init_std,
        tensor_model_parallel_size=p.tp,
        pipeline_model_parallel_size=p.pp,
        virtual_pipeline_model_parallel_size=p.vpp,
        sequence_parallel=p.sequence_parallel,
        pipeline_dtype=dtype,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        use_cpu_initialization=on_cpu,
        perform_initialization=True,
        gradient_accumulation_fusion=False,
        bias_activation_fusion=not on_cpu,
        # The local spec's fused softmax imports Apex's `scaled_masked_softmax_cuda` at its first bf16
        # step (a ModuleNotFoundError on a CUDA machine without Apex, seen on an H200).
        masked_softmax_fusion=not on_cpu and _has_module("scaled_masked_softmax_cuda"),
        bias_dropout_fusion=not on_cpu,
        apply_rope_fusion=False,
        # gloo pairs sends and receives to one peer by posting order, unlike NCCL's grouped calls:
        # batched, the interleaved schedule at pp=2 (prev == next) crosses activations and gradients.
        batch_p2p_comm=not (on_cpu and p.vpp),
    )


def _has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def _layer_spec(job: JobConfig) -> Any:
    from megatron.core.models.gpt import gpt_layer_specs

    if job.hardware.device == "cuda" and _has_module("transformer_engine"):
        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec()
    spec = gpt_layer_specs.get_gpt_layer_local_spec()
    if job.hardware.device == "cuda":
        from air_hpc.backend.sdpa_attention import SdpaAttention

        spec.submodules.self_attention.submodules.core_attention = SdpaAttention
    return spec


def build(job: JobConfig, ctx: ParallelContext) -> Model:
    """Build this rank's chunks, wrap them in DDP, attach the optimizer and scheduler.

    The caller seeds every rank alike first (:func:`air_hpc.train.parallel.seed`).
    """
    from megatron.core.distributed import finalize_model_grads

    config = transformer_config(job)
    chunks = _chunks(job, ctx, config)
    config.finalize_model_grads_func = finalize_model_grads
    config.no_sync_func = [c.no_sync for c in chunks] if len(chunks) > 1 else chunks[0].no_sync
    optimizer, scheduler = _optimizer(job, ctx, config, chunks)
    model = Model(chunks=chunks, optimizer=optimizer, scheduler=scheduler, config=config)
    log.info("built %d chunk(s), %d parameters on this rank", len(chunks), model.num_parameters)
    return model


def _chunks(job: JobConfig, ctx: ParallelContext, config: Any) -> list[Any]:
    """One DDP-wrapped GPTModel per virtual pipeline chunk of this rank, built in chunk order (the RNG's order)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.module import Float16Module

    spec = _layer_spec(job)
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=False,
        use_distributed_optimizer=job.parallel.distributed_optimizer,
    )
    chunks = []
    for chunk in range(ctx.chunks):
        module: torch.nn.Module = GPTModel(
            config=config,
            transformer_layer_spec=spec,
            vocab_size=job.model.vocab_size,
            max_sequence_length=job.model.seq_len,
            pre_process=ctx.chunk_is_first(chunk),
            post_process=ctx.chunk_is_last(chunk),
            share_embeddings_and_output_weights=False,
            position_embedding_type="learned_absolute",
            vp_stage=chunk if ctx.layout.vpp else None,
        )
        if job.hardware.device == "cuda":
            module.cuda(torch.cuda.current_device())
        if config.bf16:
            module = Float16Module(config, module)
        chunks.append(DistributedDataParallel(config=config, ddp_config=ddp_config, module=module))
    return chunks


def _optimizer(job: JobConfig, ctx: ParallelContext, config: Any, chunks: list[Any]) -> tuple[Any, Any]:
    """Megatron's Adam over the chunks and its cosine schedule (warm-up, then decay to min_lr at the last step)."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    t = job.train
    optimizer = get_megatron_optimizer(
        OptimizerConfig(
            optimizer="adam",
            lr=t.lr,
            min_lr=t.min_lr,
            weight_decay=t.weight_decay,
            adam_beta1=t.adam_beta1,
            adam_beta2=t.adam_beta2,
            adam_eps=t.adam_eps,
            clip_grad=t.clip_grad,
            bf16=config.bf16,
            params_dtype=config.params_dtype,
            use_distributed_optimizer=job.parallel.distributed_optimizer,
        ),
        chunks,
        use_gloo_process_groups=ctx.backend == "nccl",
    )
    scheduler = OptimizerParamScheduler(
        optimizer,
        init_lr=0.0,
        max_lr=t.lr,
        min_lr=t.min_lr,
        lr_warmup_steps=t.lr_warmup_steps,
        lr_decay_steps=t.steps,
        lr_decay_style="cosine",
        start_wd=t.weight_decay,
        end_wd=t.weight_decay,
        wd_incr_steps=t.steps,
        wd_incr_style="constant",
    )
    return optimizer, scheduler
