"""The CPU compatibility layer against the installed megatron-core.

Fails when a patch becomes unnecessary (Megatron no longer has the CUDA-only
code it works around, or a CPU step runs without it) or wrong (a patched step
fails, or the RNG tracker no longer drives the CPU generator). One rank, gloo,
in this process: real Megatron, a real GPTModel, a real optimizer step.
"""

import importlib
import inspect
import math
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from air_hpc.backend import megatron_compat
from air_hpc.config.load import load_job
from air_hpc.config.models import JobConfig
from air_hpc.data.blend import open_samples
from air_hpc.train import data, model, parallel
from air_hpc.train.loop import StepRunner

REPO = Path(__file__).resolve().parents[2]

#: Patches whose CUDA-only code a one-rank, no-pipeline step reaches on every fresh start.
NEEDED_BY_ONE_RANK_STEP = (
    "schedules",
    "causal_mask",
    "memory_buffer",
    "grad_buffer",
    "optimizer",
    "clip_grads",
    "clip_assert",
    "rng_tracker",
)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> JobConfig:
    corpus = tmp_path_factory.mktemp("corpus") / "corpus.h5"
    data.prepare([REPO / "README.md"], corpus, data.ByteTokenizer())
    return load_job(
        REPO / "configs/jobs/gpt-tiny-local.yaml",
        [
            "resources.tasks_per_node=1",
            "parallel.tp=1",
            "parallel.pp=1",
            "train.global_batch_size=2",
            "train.micro_batch_size=1",
            "model.seq_len=32",
            f"data.path={corpus}",
        ],
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture()
def one_rank(job: JobConfig) -> Iterator[parallel.ParallelContext]:
    env = parallel.DistEnv(0, 1, 0, "127.0.0.1", _free_port(), "localhost")
    with parallel.distributed(env, job.layout, "gloo", 60) as ctx:
        yield ctx


def _one_step(job: JobConfig, skip: frozenset[str] = frozenset()) -> float:
    env = parallel.DistEnv(0, 1, 0, "127.0.0.1", _free_port(), "localhost")
    with megatron_compat.cpu_patched(skip), parallel.distributed(env, job.layout, "gloo", 60) as ctx:
        parallel.seed(ctx, job.train.seed)
        built = model.build(job, ctx)
        samples = open_samples(job)
        result = StepRunner(job, ctx, built, samples).step(0)
        samples.close()
        return result.loss


@pytest.mark.parametrize("patch", (*megatron_compat.CPU_PATCHES, megatron_compat.FINALIZE_ON_CPU), ids=lambda p: p.name)
def test_megatron_still_has_the_cuda_only_code_each_patch_works_around(patch: megatron_compat.Patch) -> None:
    source = inspect.getsource(importlib.import_module(patch.evidence_module))
    assert patch.evidence in source, f"patch {patch.name} looks unnecessary: {patch.evidence!r} is gone"
    assert hasattr(importlib.import_module(patch.module), patch.attribute)


def test_patched_restores_every_original() -> None:
    patches = megatron_compat.CPU_PATCHES
    originals = {p.name: getattr(importlib.import_module(p.module), p.attribute) for p in patches}
    with megatron_compat.cpu_patched():
        assert all(getattr(importlib.import_module(p.module), p.attribute) is not originals[p.name] for p in patches)
    assert all(getattr(importlib.import_module(p.module), p.attribute) is originals[p.name] for p in patches)


def test_a_training_step_runs_on_cpu_with_the_layer(job: JobConfig) -> None:
    loss = _one_step(job)
    assert math.isfinite(loss) and 4.0 < loss < 8.0


@pytest.mark.parametrize("name", NEEDED_BY_ONE_RANK_STEP)
def test_the_step_fails_without_each_patch(job: JobConfig, name: str) -> None:
    with pytest.raises((AssertionError, RuntimeError)):
        _one_step(job, skip=frozenset({name}))


def _forked_draws(ctx: parallel.ParallelContext, skip: frozenset[str]) -> tuple[torch.Tensor, torch.Tensor]:
    from megatron.core import tensor_parallel

    with megatron_compat.cpu_patched(skip):
        parallel.seed(ctx, 1234)
        with tensor_parallel.get_cuda_rng_tracker().fork():
            inside = torch.rand(4)
        return inside, torch.rand(4)


def test_rng_tracker_forks_the_cpu_generator(one_rank: parallel.ParallelContext) -> None:
    inside, after = _forked_draws(one_rank, frozenset())
    assert torch.equal(inside, torch.rand(4, generator=torch.Generator().manual_seed(1234 + 2718)))
    assert torch.equal(after, torch.rand(4, generator=torch.Generator().manual_seed(1234)))


@pytest.mark.parametrize("name", ["rng_get", "rng_set"])
def test_rng_fork_is_wrong_without_each_rng_patch(one_rank: parallel.ParallelContext, name: str) -> None:
    try:
        inside, _ = _forked_draws(one_rank, frozenset({name}))
    except (AssertionError, AttributeError, RuntimeError):
        return
    assert not torch.equal(inside, torch.rand(4, generator=torch.Generator().manual_seed(1234 + 2718)))


def test_clip_replacement_scales_like_megatron() -> None:
    params = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))]
    for p in params:
        p.grad = torch.full_like(p, 2.0)
    megatron_compat._clip_grad_by_total_norm_cpu(params, max_norm=1.0, total_norm=4.0)
    assert all(p.grad is not None and torch.allclose(p.grad, torch.full_like(p, 2.0 / (4.0 + 1e-6))) for p in params)
    from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

    with pytest.raises(AssertionError):
        clip_grad_by_total_norm_fp32(params, 1.0, 4.0)
