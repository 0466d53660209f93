#!/usr/bin/env python
"""Trainer overhead and HDF5 loader speed, each against a baseline measured in the same run.

1. Step time of air_hpc's trainer vs a bare loop written directly against megatron-core
   (GPTModel, DDP, optimizer, scheduler, schedule) on in-memory tokens, same config, same ranks.
   Twice: the step alone (``StepRunner`` on HDF5 data, alternating step by step with the bare
   loop) and the whole ``trainer.train`` loop (wall time between steps, so metrics, the stop
   agreement and the checkpoint poll count; bare blocks before and after). Target <= 1.05.
   On CPU both run under ``air_hpc.backend.megatron_compat`` (megatron-core needs it to run at all).
2. HDF5 loader throughput (``BlendedSamples.batch`` on ``data.path``) vs per-sample slicing of a NumPy memmap of the
   same tokens, same sample indices. Target >= 1.0.
3. Loader time as a share of our step time. Target <= 2 %.

    python scripts/bench/train.py [--steps 40] [--job configs/jobs/gpt-tiny-local.yaml]
"""

import argparse
import itertools
import json
import multiprocessing
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from air_hpc.config.load import load_job
from air_hpc.config.models import DataConfig, JobConfig
from air_hpc.data.blend import BlendedSamples, check_for_training, open_samples
from air_hpc.train import data

REPO = Path(__file__).resolve().parents[2]


def bare_config(job: JobConfig) -> Any:
    """Megatron's TransformerConfig for the job's model, set up as air_hpc's CPU build sets it."""
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    m, p = job.model, job.parallel
    return TransformerConfig(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads,
        ffn_hidden_size=m.ffn_hidden_size,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=p.tp,
        pipeline_model_parallel_size=p.pp,
        pipeline_dtype=torch.float32,
        use_cpu_initialization=True,
        gradient_accumulation_fusion=False,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        bias_dropout_fusion=False,
    )


def bare_model(job: JobConfig, config: Any, pp_first: bool, pp_last: bool) -> tuple[Any, Any, Any]:
    """The GPT in DDP, its optimizer and its scheduler: megatron-core calls only."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    m, t = job.model, job.train
    gpt = GPTModel(
        config, get_gpt_layer_local_spec(), m.vocab_size, m.seq_len, pre_process=pp_first, post_process=pp_last
    )
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(grad_reduce_in_fp32=True), gpt)
    config.finalize_model_grads_func = finalize_model_grads
    config.no_sync_func = ddp.no_sync
    opt = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=t.lr, min_lr=t.min_lr, weight_decay=t.weight_decay, clip_grad=t.clip_grad),
        [ddp],
        use_gloo_process_groups=False,
    )
    sched = OptimizerParamScheduler(
        opt, 0.0, t.lr, t.min_lr, t.lr_warmup_steps, t.steps, "cosine", 0.01, 0.01, 1, "constant"
    )
    return ddp, opt, sched


def bare_megatron(job: JobConfig, pp_first: bool, pp_last: bool) -> Any:
    """The bare loop: megatron-core calls only, no air_hpc code, in-memory random tokens."""
    import torch
    from megatron.core import tensor_parallel
    from megatron.core.pipeline_parallel import get_forward_backward_func

    m, t = job.model, job.train
    tensor_parallel.model_parallel_cuda_manual_seed(t.seed)
    torch.manual_seed(t.seed)
    ddp, opt, sched = bare_model(job, bare_config(job), pp_first, pp_last)
    micro = t.global_batch_size // (t.micro_batch_size * job.layout.dp)
    tokens = torch.randint(0, 257, (micro, t.micro_batch_size, m.seq_len + 1))
    positions = torch.arange(m.seq_len).unsqueeze(0).expand(t.micro_batch_size, -1)
    forward_backward = get_forward_backward_func()

    def loss_func(output: Any) -> Any:
        loss = output.float().sum()
        n = torch.tensor(output.numel(), dtype=torch.int)
        return loss, n, {"lm loss": torch.stack([loss.detach().clone(), n.float()])}

    def forward_step(it: Any, model: Any) -> Any:
        batch = next(it) if it is not None else None
        ids = batch[:, :-1] if batch is not None else None
        labels = batch[:, 1:] if batch is not None else None
        return model(ids, positions if ids is not None else None, None, labels=labels), loss_func

    def step() -> None:
        ddp.zero_grad_buffer()
        opt.zero_grad()
        forward_backward(
            forward_step_func=forward_step,
            data_iterator=iter(tokens) if (pp_first or pp_last) else None,
            model=ddp,
            num_microbatches=micro,
            seq_length=m.seq_len,
            micro_batch_size=t.micro_batch_size,
        )
        opt.step()
        sched.step(increment=1)

    return step


def rank_main(rank: int, world: int, port: int, job_json: str, steps: int, out: str) -> None:
    import torch

    torch.set_num_threads(1)
    from air_hpc.backend import megatron_compat
    from air_hpc.config.models import JobConfig
    from air_hpc.train import model, parallel
    from air_hpc.train.loop import StepRunner

    job = JobConfig.model_validate_json(job_json)
    env = parallel.DistEnv(rank, world, rank, "127.0.0.1", port, "localhost")
    with megatron_compat.cpu_patched(), parallel.distributed(env, job.layout, "gloo", 300) as ctx:
        bare_step = bare_megatron(job, ctx.is_first_stage, ctx.is_last_stage)
        parallel.seed(ctx, job.train.seed)
        runner = StepRunner(job, ctx, model.build(job, ctx), open_samples(job))
        ours: list[float] = []
        bare: list[float] = []
        loader: list[float] = []
        consumed = 0
        for _ in range(2):
            bare_step()
            runner.step(consumed)
        for _ in range(steps):
            for which in ("bare", "ours"):
                torch.distributed.barrier()
                started = time.perf_counter()
                if which == "bare":
                    bare_step()
                else:
                    result = runner.step(consumed)
                    consumed += job.train.global_batch_size
                    loader.append(result.loader_time_s)
                torch.distributed.barrier()
                (bare if which == "bare" else ours).append(time.perf_counter() - started)
        bare_before = _timed_block(bare_step, steps)
        loop = _full_loop_step_times(job, ctx, Path(out).parent / "loop-run", steps)
        bare_after = _timed_block(bare_step, steps)
        if rank == 0:
            Path(out).write_text(
                json.dumps(
                    {"ours": ours, "bare": bare, "loader": loader, "loop": loop, "loop_bare": bare_before + bare_after}
                )
            )


def _timed_block(step: Any, steps: int) -> list[float]:
    import torch

    times = []
    for _ in range(steps):
        torch.distributed.barrier()
        started = time.perf_counter()
        step()
        torch.distributed.barrier()
        times.append(time.perf_counter() - started)
    return times


def _full_loop_step_times(job: JobConfig, ctx: Any, run_path: Path, steps: int) -> list[float]:
    """Wall time between consecutive steps of ``trainer.train`` (metrics' ``time``): everything the loop does."""
    import torch

    from air_hpc.records.metrics import read_metrics
    from air_hpc.records.rundir import RunDir
    from air_hpc.train import trainer

    run = job.model_copy(
        update={
            "train": job.train.model_copy(update={"steps": steps + 3}),
            "checkpoint": job.checkpoint.model_copy(update={"interval_steps": 10**6}),
        }
    )
    trainer.train(run, RunDir(run_path), ctx)
    torch.distributed.barrier()
    stamps = [r["time"] for r in read_metrics(RunDir(run_path).metrics)]
    return [b - a for a, b in itertools.pairwise(stamps[2:])]


def loader_bench(path: Path, seq_len: int, batch: int, batches: int, repeats: int = 5) -> tuple[float, float]:
    """Tokens/s of BlendedSamples.batch and of a memmap baseline over the same sample indices (best of repeats).

    The indices are consecutive global batches, as training reads them; the baseline gets the
    shuffled offsets precomputed, so only our loader pays for the sample order.
    """
    import h5py
    import numpy as np

    samples = BlendedSamples(check_for_training(DataConfig(path=path), seq_len, 1 << 20), seed=3)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "tokens.npy"
        with h5py.File(path, "r") as fh:
            np.save(raw, fh["tokens"][:])
        memmap = np.load(raw, mmap_mode="r")
        index_sets = [np.arange(k * batch, (k + 1) * batch) for k in range(batches)]
        starts = [samples.locate(ix)[1] * seq_len for ix in index_sets]
        samples.batch(index_sets[0])
        for ix, st in zip(index_sets, starts, strict=True):
            expected = np.stack([memmap[s : s + seq_len + 1] for s in st]).astype(np.int64)
            if not np.array_equal(samples.batch(ix), expected):
                raise SystemExit("loader benchmark: HDF5 and memmap batches differ")
        ours_s = base_s = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            for ix in index_sets:
                samples.batch(ix)
            ours_s = min(ours_s, time.perf_counter() - t0)
            t0 = time.perf_counter()
            for st in starts:
                np.stack([memmap[s : s + seq_len + 1] for s in st]).astype(np.int64)
            base_s = min(base_s, time.perf_counter() - t0)
        tokens = batches * batch * (seq_len + 1)
        del memmap
    samples.close()
    return tokens / ours_s, tokens / base_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", default=str(REPO / "configs/jobs/gpt-tiny-local.yaml"))
    parser.add_argument("--steps", type=int, default=40, help="timed steps of each loop (alternating)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.h5"
        data.prepare(data.project_sources(), corpus, data.ByteTokenizer())
        job = load_job(args.job, [f"data.path={corpus}", f"run.root={tmp}"])
        world = job.resources.world_size
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        out = Path(tmp) / "steps.json"
        ctx = multiprocessing.get_context("spawn")
        procs = [
            ctx.Process(
                target=rank_main,
                args=(r, world, port, job.model_dump_json(), args.steps, str(out)),
            )
            for r in range(world)
        ]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
        if any(proc.exitcode for proc in procs):
            raise SystemExit(f"benchmark ranks failed: {[proc.exitcode for proc in procs]}")
        times = json.loads(out.read_text())
        mbs_tokens = job.train.global_batch_size
        ours_tps, base_tps = loader_bench(corpus, job.model.seq_len, mbs_tokens, 2000)
    ours, bare = statistics.median(times["ours"]), statistics.median(times["bare"])
    loop, loop_bare = statistics.median(times["loop"]), statistics.median(times["loop_bare"])
    loader_share = statistics.mean(times["loader"]) / statistics.mean(times["ours"])
    layout = job.layout
    print(f"layout tp{layout.tp} pp{layout.pp} dp{layout.dp}, {world} CPU ranks, {args.steps} alternating steps each")
    print(
        f"step time   ours {ours * 1e3:8.2f} ms   bare megatron-core {bare * 1e3:8.2f} ms   "
        f"ratio {ours / bare:.3f} (target <= 1.05)"
    )
    print(
        f"loader      hdf5 {ours_tps / 1e6:8.2f} Mtok/s memmap {base_tps / 1e6:8.2f} Mtok/s   "
        f"ratio {ours_tps / base_tps:.2f} (target >= 1.0)"
    )
    print(
        f"full loop   ours {loop * 1e3:8.2f} ms   bare megatron-core {loop_bare * 1e3:8.2f} ms   "
        f"ratio {loop / loop_bare:.3f} (target <= 1.05; metrics, stop agreement, checkpoint poll included)"
    )
    print(f"loader share of step time {loader_share * 100:.2f} % (target <= 2 %)")


if __name__ == "__main__":
    main()
