#!/usr/bin/env python3
"""Checkpoint benchmark: our saves and loads against the file system's own speed, in one run.

Prints, for a Megatron-core GPT on gloo CPU ranks (real ``Checkpointer``, real ``dist_checkpointing``):

- sync save throughput (plan + write + fsync + sha256 manifest + commit) vs ``dd ... conv=fsync``
  of the same number of bytes on the same file system (target >= 0.8x);
- load throughput (verify + load, page cache dropped for the checkpoint's files) vs a cold
  sequential read of the same files (``posix_fadvise(DONTNEED)`` first; no root needed);
- training stall of an async save vs a sync one: extra wall time of the training steps over
  which the save happens, compared with steps without a save (target <= 0.1x).

Usage: ``scripts/bench/ckpt.py [--ranks 2] [--hidden 512] [--layers 4] [--vocab 16384] [--dir DIR]``.
The ranks run as subprocesses of this script (``--worker``); rank 0 prints the report.
"""

import os
import sys

# This directory is sys.path[0] when the script runs, and it holds select.py, which would shadow
# the standard library's select module (imported by socket and subprocess).
sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != os.path.dirname(os.path.realpath(__file__))]

import argparse  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "configs" / "jobs" / "gpt-tiny-local.yaml"


def drop_cache(paths: list[Path]) -> None:
    """Evict these (clean, fsynced) files from the page cache."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cold_read_s(paths: list[Path]) -> float:
    drop_cache(paths)
    started = time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as stream:
            while stream.read(8 << 20):
                pass
    return time.perf_counter() - started


def dd_write_s(directory: Path, nbytes: int) -> float:
    target = directory / "dd.bench"
    block = 4 << 20
    count = max(1, -(-nbytes // block))
    started = time.perf_counter()
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={target}", f"bs={block}", f"count={count}", "conv=fsync"],
        check=True,
        capture_output=True,
    )
    elapsed = time.perf_counter() - started
    target.unlink()
    return elapsed * nbytes / (count * block)


def worker(args: argparse.Namespace) -> None:
    import contextlib

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    from air_hpc.config import load_job
    from air_hpc.resilience.checkpointer import Checkpointer
    from air_hpc.resilience.events import EventLog, read_events
    from air_hpc.resilience.store import CheckpointStore
    from air_hpc.train import cpu_compat, parallel
    from air_hpc.train import model as model_mod
    from air_hpc.train.data import ByteTokenizer, TokenSamples, prepare
    from air_hpc.train.loop import StepRunner

    workdir = Path(args.dir)
    corpus = workdir / "corpus.h5"
    overrides = (
        f"data.path={corpus}",
        f"run.root={workdir}",
        "run.name=bench",
        f"resources.tasks_per_node={args.ranks}",
        f"parallel.tp={args.ranks}",
        "parallel.pp=1",
        f"model.hidden_size={args.hidden}",
        f"model.num_layers={args.layers}",
        f"model.ffn_hidden_size={4 * args.hidden}",
        f"model.vocab_size={args.vocab}",
        "model.num_attention_heads=8",
        "train.global_batch_size=4",
        "train.micro_batch_size=2",
    )
    job = load_job(str(JOB), overrides)
    if args.rank == 0 and not corpus.exists():
        prepare([REPO / "README.md", REPO / "configs" / "jobs" / "gpt-tiny-local.yaml"], corpus, ByteTokenizer())
    env = parallel.DistEnv(args.rank, args.ranks, args.rank, "127.0.0.1", args.port, "localhost")
    cpu_compat.start_checkpoint_queue()
    with contextlib.ExitStack() as stack:
        stack.enter_context(cpu_compat.patched())
        ctx = stack.enter_context(parallel.distributed(env, job.layout, "gloo", 600))
        dist.barrier()  # the corpus exists
        parallel.seed(ctx, job.train.seed)
        model = model_mod.build(job, ctx)
        samples = TokenSamples(job.data.path, job.model.seq_len, job.train.seed)
        runner = StepRunner(job, ctx, model, samples)
        root = workdir / "checkpoints"
        store = CheckpointStore(root, keep_last=2)
        step = 0

        def train(n: int, ckpt: Checkpointer | None = None) -> float:
            nonlocal step
            started = time.perf_counter()
            for _ in range(n):
                step += 1
                runner.step(step * job.train.global_batch_size)
                if ckpt is not None:
                    ckpt.poll()
            dist.barrier()
            return time.perf_counter() - started

        events = EventLog(workdir / "events.jsonl")
        sync_ckpt = Checkpointer(store, events, async_save=False)
        async_ckpt = Checkpointer(store, events, async_save=True)
        train(2)
        step_s = statistics.median(train(args.steps) for _ in range(3)) / args.steps

        sync_s, async_stall_s = [], []
        for _ in range(args.repeats):
            train(1)
            dist.barrier()
            started = time.perf_counter()
            sync_ckpt.save(step, model.chunks, model.optimizer, model.scheduler, {}, sync=True)
            sync_s.append(time.perf_counter() - started)
            train(1)
            # Async: the save call, then steps until the save is committed (at least --steps of them);
            # the stall is the extra time over the same number of plain steps.
            started = time.perf_counter()
            async_ckpt.save(step, model.chunks, model.optimizer, model.scheduler, {}, sync=False)
            steps = 0
            while steps < args.steps or async_ckpt.writing:
                train(1, async_ckpt)
                steps += 1
            async_ckpt.wait()
            dist.barrier()
            async_stall_s.append(time.perf_counter() - started - steps * step_s)
        baseline_s = step_s * args.steps
        latest = store.latest_complete(check="size")
        assert latest is not None
        files = [p for p in store.path(latest).rglob("*") if p.is_file()]
        nbytes = sum(p.stat().st_size for p in files)

        load_s: dict[str, float] = {}
        for check in ("sha256", "size"):
            loader = Checkpointer(store, None, async_save=False, verify=check)  # type: ignore[arg-type]
            times = []
            for _ in range(args.repeats):
                if args.rank == 0:
                    drop_cache(files)
                dist.barrier()
                started = time.perf_counter()
                loader.resume(model.chunks, model.optimizer, model.scheduler)
                dist.barrier()
                times.append(time.perf_counter() - started)
            load_s[check] = statistics.median(times)
        if args.rank == 0:
            dd_s = statistics.median(dd_write_s(root, nbytes) for _ in range(args.repeats))
            cold_s = statistics.median(cold_read_s(files) for _ in range(args.repeats))
            report(args, nbytes, len(files), baseline_s, sync_s, async_stall_s, dd_s, cold_s, load_s)
            saved = [e for e in read_events(events.path) if e["kind"] == "checkpoint_saved"]
            for kind in (False, True):
                last = [e for e in saved if e["async"] is kind][-1]
                print(f"phases of the last {'async' if kind else 'sync'} save (s): {last['phases']}")
        dist.barrier()


def report(
    args: argparse.Namespace,
    nbytes: int,
    nfiles: int,
    baseline_s: float,
    sync_s: list[float],
    async_stall_s: list[float],
    dd_s: float,
    cold_s: float,
    load_s: dict[str, float],
) -> None:
    mb = nbytes / 1e6
    sync = statistics.median(sync_s)
    stall_async = max(0.0, statistics.median(async_stall_s))
    rows: list[tuple[str, Any]] = [
        ("checkpoint", f"{mb:.1f} MB in {nfiles} files, {args.ranks} ranks (TP{args.ranks})"),
        ("training step", f"{baseline_s / args.steps * 1e3:.1f} ms"),
        ("dd conv=fsync write", f"{mb / dd_s:.0f} MB/s"),
        ("sync save (write+fsync+sha256+commit)", f"{mb / sync:.0f} MB/s  ({sync:.3f} s)"),
        ("cold sequential read", f"{mb / cold_s:.0f} MB/s"),
        ("load, sha256 verify", f"{mb / load_s['sha256']:.0f} MB/s  ({load_s['sha256']:.3f} s)"),
        ("load, size verify", f"{mb / load_s['size']:.0f} MB/s  ({load_s['size']:.3f} s)"),
        ("stall: sync save", f"{sync:.3f} s"),
        ("stall: async save", f"{stall_async:.3f} s"),
    ]
    ratios = {
        "sync_save_vs_dd": (dd_s / sync, 0.8, ">="),
        "load_sha256_vs_cold_read": (cold_s / load_s["sha256"], None, ""),
        "load_size_vs_cold_read": (cold_s / load_s["size"], None, ""),
        "async_stall_vs_sync": (stall_async / sync, 0.1, "<="),
    }
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    print()
    for name, (value, target, op) in ratios.items():
        verdict = ""
        if target is not None:
            ok = value >= target if op == ">=" else value <= target
            verdict = f"  (target {op} {target}: {'ok' if ok else 'MISSED'})"
        print(f"ratio {name:<26} {value:6.3f}{verdict}")
    if args.json:
        print(json.dumps({k: v[0] for k, v in ratios.items()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=16384)
    parser.add_argument("--steps", type=int, default=4, help="training steps per timing window")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", help="where to write (default: a temp dir under the repo's runs/)")
    parser.add_argument("--json", action="store_true", help="also print the ratios as one JSON line")
    parser.add_argument("--worker", type=int, dest="rank", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        worker(args)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = Path(args.dir) if args.dir else REPO / "runs"
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base, prefix="bench-ckpt-") as workdir:
        forwarded = [a for a in sys.argv[1:] if not a.startswith("--dir")]
        if args.dir:
            forwarded = [a for a in forwarded if a != args.dir]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, *forwarded, "--dir", workdir, "--worker", str(r), "--port", str(port)],
                env=env,
                stdout=None if r == 0 else subprocess.DEVNULL,
            )
            for r in range(args.ranks)
        ]
        codes = [p.wait() for p in procs]
    if any(codes):
        sys.exit(f"bench ranks failed: exit codes {codes}")


if __name__ == "__main__":
    main()
