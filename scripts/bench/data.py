#!/usr/bin/env python
"""Blended data loading against megatron-core's own, and as a share of a training step; each a ratio
against a baseline measured in the same run.

1. Samples/s of air_hpc's blended loader (``BlendedSamples.batch``, micro-batches of 8) vs
   megatron-core's ``BlendedDataset`` over ``GPTDataset`` (built by ``BlendedMegatronDatasetBuilder``,
   no masks, no cache; ``dataset[i]`` for the same 8 indices, stacked as a collate would), both
   reading the same three Megatron ``.bin``/``.idx`` corpora in place with the same weights.
   Also megatron-core's token fetch alone (``_query_document_sample_shuffle_indices``), without
   the masks and labels ``__getitem__`` builds. Target >= 1.0 against ``BlendedDataset``.
2. Loader time as a share of step time: gpt-tiny (one CPU rank, TP1 PP1, the real ``StepRunner``,
   ``data.read_ahead`` as configured, on by default) on a 3-source blend of 64 HDF5 shards.
   Target <= 2 %.
3. ``data prepare`` throughput (input MB/s) with one worker per core vs one worker, same inputs,
   same shards. Target close to the core count.

    python scripts/bench/data.py [--samples 4000] [--steps 20] [--prepare-mb 24]
"""

import argparse
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from air_hpc.config.load import load_job
from air_hpc.config.models import DataConfig
from air_hpc.data.blend import BlendedSamples, check_for_training, open_samples

REPO = Path(__file__).resolve().parents[2]
WEIGHTS = (0.7, 0.2, 0.1)
VOCAB = 50257
SEQ = 1024


def write_megatron(prefix: Path, tokens: int, seed: int) -> Path:
    """A Megatron corpus of random documents (8..4000 tokens each, EOD last) written by its own builder."""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = np.random.default_rng(seed)
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    written = 0
    while written < tokens:
        doc = rng.integers(0, VOCAB - 1, int(rng.integers(8, 4000)), dtype=np.int64)
        doc[-1] = VOCAB - 1
        builder.add_document(torch.from_numpy(doc), [len(doc)])
        written += len(doc)
    builder.finalize(f"{prefix}.idx")
    prefix.with_suffix(".json").write_text(f'{{"tokenizer": "random", "vocab_size": {VOCAB}, "eod_id": {VOCAB - 1}}}')
    return prefix


class _Tokenizer:
    """What GPTDataset asks of a tokenizer."""

    vocab_size = VOCAB
    eod = VOCAB - 1
    pad = -1
    unique_identifiers: ClassVar[dict[str, str]] = {"class": "bench"}


def megatron_blend(prefixes: list[Path], samples: int) -> Any:
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    config = GPTDatasetConfig(
        random_seed=1234,
        sequence_length=SEQ,
        blend=([str(p) for p in prefixes], list(WEIGHTS)),
        split="100,0,0",
        tokenizer=_Tokenizer(),  # type: ignore[arg-type]
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
        path_to_cache=None,
        mmap_bin_files=True,
    )
    return BlendedMegatronDatasetBuilder(GPTDataset, [samples, 0, 0], lambda: True, config).build()[0]


def best_of(repeats: int, run: Any) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def loader_vs_megatron(tmp: Path, samples: int) -> None:
    import torch

    prefixes = [write_megatron(tmp / f"src{i}", 2_000_000 * (3 - i), seed=i) for i in range(3)]
    theirs = megatron_blend(prefixes, samples)
    data = DataConfig(
        blend=tuple({"path": Path(f"{p}.idx"), "weight": w} for p, w in zip(prefixes, WEIGHTS, strict=True))
    )
    ours = BlendedSamples(check_for_training(data, SEQ, VOCAB), seed=1234, vocab_size=VOCAB)
    batches = [np.arange(k, k + 8) for k in range(0, samples, 8)]
    ours.batch(batches[0])
    theirs[0]

    def run_ours() -> None:
        for ix in batches:
            torch.from_numpy(ours.batch(ix))

    def run_theirs() -> None:
        for ix in batches:
            torch.stack([theirs[int(i)]["tokens"] for i in ix])

    def run_theirs_tokens() -> None:
        for ix in batches:
            rows = []
            for i in ix:
                d, k = theirs.dataset_index[i], theirs.dataset_sample_index[i]
                rows.append(theirs.datasets[d]._query_document_sample_shuffle_indices(k)[0])
            torch.from_numpy(np.stack(rows).astype(np.int64))

    ours_s, theirs_s, tokens_s = best_of(3, run_ours), best_of(3, run_theirs), best_of(3, run_theirs_tokens)
    got = np.bincount(ours.schedule.assign(np.arange(samples))[0], minlength=3) / samples
    want = np.bincount(np.asarray(theirs.dataset_index[:samples]), minlength=3) / samples
    print(f"blend of 3 Megatron corpora (weights {WEIGHTS}), seq_len {SEQ}, {samples} samples in micro-batches of 8")
    print(f"  shares drawn: ours {np.round(got, 4).tolist()}, megatron-core {np.round(want, 4).tolist()}")
    print(
        f"  samples/s   ours {samples / ours_s:10.0f}   megatron-core BlendedDataset {samples / theirs_s:10.0f}   "
        f"ratio {theirs_s / ours_s:.2f} (target >= 1.0)"
    )
    print(
        f"  samples/s   ours {samples / ours_s:10.0f}   megatron-core token fetch alone {samples / tokens_s:10.0f}   "
        f"ratio {tokens_s / ours_s:.2f}"
    )


def loader_share(tmp: Path, steps: int) -> None:
    """gpt-tiny on one CPU rank over a 3-source blend of 64 shards: loader seconds / step seconds."""
    import torch

    from air_hpc.backend import megatron_compat
    from air_hpc.train import data, model, parallel
    from air_hpc.train.loop import StepRunner

    torch.set_num_threads(1)
    sources = data.project_sources()
    counts = {"web": 40, "code": 16, "math": 8}
    for name, count in counts.items():
        for i in range(count):
            data.prepare(
                sources[i % len(sources) :: count] or sources[:1], tmp / name / f"{i:03d}.h5", data.ByteTokenizer()
            )
    blend = ", ".join(f"{{path: {tmp / name}, weight: {w}}}" for name, w in zip(counts, WEIGHTS, strict=True))
    job = load_job(
        REPO / "configs/jobs/gpt-tiny-local.yaml",
        [f"data.blend=[{blend}]", f"run.root={tmp}", "resources.tasks_per_node=1", "parallel.tp=1", "parallel.pp=1"],
    )
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = parallel.DistEnv(0, 1, 0, "127.0.0.1", port, "localhost")
    with megatron_compat.cpu_patched(), parallel.distributed(env, job.layout, "gloo", 300) as ctx:
        parallel.seed(ctx, job.train.seed)
        samples = open_samples(job)
        runner = StepRunner(job, ctx, model.build(job, ctx), samples)
        loader, step = [], []
        for k in range(steps + 2):
            result = runner.step(k * job.train.global_batch_size)
            if k >= 2:
                loader.append(result.loader_time_s)
                step.append(result.step_time_s)
        samples.close()
    share = sum(loader) / sum(step)
    print(
        f"gpt-tiny, 1 CPU rank, blend of {sum(counts.values())} shards in 3 sources, {steps} steps: "
        f"loader {np.mean(loader) * 1e3:.3f} ms of {np.mean(step) * 1e3:.1f} ms a step, "
        f"share {share * 100:.2f} % (target <= 2 %)"
    )


def prepare_speedup(tmp: Path, megabytes: int) -> None:
    """Tokenize the same inputs (copies of the project's text) with one worker and with every core.

    Wall time gives the speedup; the workers' CPU seconds (``RUSAGE_CHILDREN``) say what the
    parallel run costs beyond the serial one, which on a machine shared with other work is what
    bounds the speedup once the cores are busy elsewhere.
    """
    import resource

    from air_hpc.train import data
    from air_hpc.train.prepare import prepare_sharded

    text = "".join(p.read_text() for p in data.project_sources())
    copies = max(1, (megabytes << 20) // len(text) // 8)
    inputs = []
    for i in range(8):
        path = tmp / "prepare-in" / f"{i}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text * copies)
        inputs.append(path)
    size = sum(p.stat().st_size for p in inputs)
    cores = len(os.sched_getaffinity(0))
    wall, cpu = {}, {}
    for workers in (1, cores):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        prepare_sharded(inputs, tmp / f"prepare-{workers}", "byte", 1 << 22, workers, group_bytes=size // 8)
        wall[workers] = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu[workers] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    mb = size / 2**20
    print(
        f"data prepare of {mb:.0f} MB in 8 groups: 1 worker {mb / wall[1]:.2f} MB/s, {cores} workers "
        f"{mb / wall[cores]:.2f} MB/s, speedup {wall[1] / wall[cores]:.2f} (target close to {cores}, the core count); "
        f"worker CPU {cpu[1]:.1f} s vs {cpu[cores]:.1f} s (ratio {cpu[cores] / cpu[1]:.2f}), "
        f"load average {os.getloadavg()[0]:.1f} on {cores} cores"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4000, help="samples read by each loader")
    parser.add_argument("--steps", type=int, default=20, help="timed gpt-tiny steps")
    parser.add_argument("--prepare-mb", type=int, default=24, help="input text for the prepare benchmark")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        loader_vs_megatron(Path(tmp), args.samples)
        loader_share(Path(tmp), args.steps)
        prepare_speedup(Path(tmp), args.prepare_mb)


if __name__ == "__main__":
    main()
