#!/usr/bin/env python3
"""Checkpoint benchmark: our saves and loads against the file system's own speed, in one run.

Prints, for a Megatron-core GPT on gloo CPU ranks (real ``Checkpointer``, real ``dist_checkpointing``):

- sync save throughput (plan + write + fsync + sha256 manifest + commit) vs ``dd ... conv=fsync``
  of the same number of bytes on the same file system (target >= 0.8x);
- load throughput (verify + load, page cache dropped for the checkpoint's files) vs a cold
  sequential read of the same files (``posix_fadvise(DONTNEED)`` first; no root needed);
- training stall of an async save vs a sync one (target <= 0.1x): the time the training loop is
  blocked in ``save``/``poll``/``wait``; also the wall-clock slowdown of the steps during which the
  background writer runs, which on a machine with fewer idle cores than writers includes CPU
  contention (the writer runs at lower priority, but serialising and hashing still take cycles).

Usage: ``scripts/bench/ckpt.py [--ranks 2] [--hidden 768] [--layers 6] [--vocab 32768] [--dir DIR]``.

``--testbed STATE_DIR`` instead preempts a gpt-tiny job on a running testbed and prints the
seconds from the signal to the first resumed step (target <= 20 s) and the steps lost (<= 1).
The ranks run as subprocesses of this script (``--worker``); rank 0 prints the report. Each
ratio is the median over ``--repeats`` pairs measured back to back (baseline, then ours).
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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
    from air_hpc.records.events import EventLog, read_events
    from air_hpc.resilience.checkpointer import Checkpointer
    from air_hpc.resilience.signals import agree
    from air_hpc.resilience.store import CheckpointStore
    from air_hpc.train import megatron_compat, parallel
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
    with contextlib.ExitStack() as stack:
        stack.enter_context(megatron_compat.cpu_patched())
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
        sync_ckpt = Checkpointer(store, events, async_save=False, layout=ctx.layout)
        async_ckpt = Checkpointer(store, events, async_save=True, layout=ctx.layout)
        train(2)
        step_s = statistics.median(train(args.steps) for _ in range(3)) / args.steps

        def sync_save() -> float:
            dist.barrier()
            started = time.perf_counter()
            sync_ckpt.save(step, model.state(), sync=True)
            return time.perf_counter() - started

        sync_save()  # warm-up; also tells the size for dd
        latest = store.latest_complete(check="size")
        if latest is None:
            raise SystemExit("bench: the warm-up save did not commit")
        nbytes = sum(p.stat().st_size for p in store.path(latest).rglob("*") if p.is_file())

        # Baselines and our numbers alternate, so that a machine whose speed drifts (shared
        # disks, other jobs) affects both sides of each ratio alike.
        dd_s: list[float] = []
        sync_s: list[float] = []
        async_stall_s: list[float] = []
        async_blocked_s: list[float] = []
        for _ in range(args.repeats):
            train(1)
            if args.rank == 0:
                dd_s.append(dd_write_s(root, nbytes))
            sync_s.append(sync_save())
            train(1)
            # Async: the save call, then steps until the save is committed (at least --steps of them);
            # the stall is the extra time over the same number of plain steps.
            started = time.perf_counter()
            async_ckpt.save(step, model.state(), sync=False)
            blocked = time.perf_counter() - started
            steps = 0
            while steps < args.steps or agree(async_ckpt.busy):
                step += 1
                runner.step(step * job.train.global_batch_size)
                polled = time.perf_counter()
                async_ckpt.poll()
                blocked += time.perf_counter() - polled
                steps += 1
            waited = time.perf_counter()
            async_ckpt.wait()
            blocked += time.perf_counter() - waited
            dist.barrier()
            async_stall_s.append(time.perf_counter() - started - steps * step_s)
            async_blocked_s.append(blocked)
        latest = store.latest_complete(check="size")
        if latest is None:
            raise SystemExit("bench: no committed checkpoint to load")
        files = [p for p in store.path(latest).rglob("*") if p.is_file()]
        nbytes = sum(p.stat().st_size for p in files)

        cold_s: list[float] = []
        load_s: dict[str, list[float]] = {"sha256": [], "size": []}
        loaders = {
            c: Checkpointer(store, None, async_save=False, verify=c, layout=ctx.layout) for c in ("sha256", "size")
        }
        for _ in range(args.repeats):
            if args.rank == 0:
                cold_s.append(cold_read_s(files))
            for check, loader in loaders.items():
                if args.rank == 0:
                    drop_cache(files)
                dist.barrier()
                started = time.perf_counter()
                loader.resume(model.state())
                dist.barrier()
                load_s[check].append(time.perf_counter() - started)
        if args.rank == 0:
            report(args, nbytes, len(files), step_s, dd_s, sync_s, async_blocked_s, async_stall_s, cold_s, load_s)
            saved = [e for e in read_events(events.path) if e["kind"] == "checkpoint_saved"]
            for kind in (False, True):
                last = [e for e in saved if e["async"] is kind][-1]
                print(f"phases of the last {'async' if kind else 'sync'} save (s): {last['phases']}")
        dist.barrier()


def report(
    args: argparse.Namespace,
    nbytes: int,
    nfiles: int,
    step_s: float,
    dd_s: list[float],
    sync_s: list[float],
    async_blocked_s: list[float],
    async_stall_s: list[float],
    cold_s: list[float],
    load_s: dict[str, list[float]],
) -> None:
    mb = nbytes / 1e6
    med = statistics.median
    rows = [
        ("checkpoint", f"{mb:.1f} MB in {nfiles} files, {args.ranks} ranks (TP{args.ranks})"),
        ("training step", f"{step_s * 1e3:.1f} ms"),
        ("dd conv=fsync write", f"{mb / med(dd_s):.0f} MB/s"),
        ("sync save (write+fsync+sha256+commit)", f"{mb / med(sync_s):.0f} MB/s  ({med(sync_s):.3f} s)"),
        ("cold sequential read", f"{mb / med(cold_s):.0f} MB/s"),
        ("load, sha256 verify (cold)", f"{mb / med(load_s['sha256']):.0f} MB/s  ({med(load_s['sha256']):.3f} s)"),
        ("load, size verify (cold)", f"{mb / med(load_s['size']):.0f} MB/s  ({med(load_s['size']):.3f} s)"),
        ("stall: sync save", f"{med(sync_s):.3f} s"),
        ("stall: async save, loop blocked", f"{med(async_blocked_s):.3f} s  (save + polls + final wait)"),
        ("stall: async save, wall slowdown", f"{max(0.0, med(async_stall_s)):.3f} s  (vs the same steps, no save)"),
        ("cores / load average", f"{os.cpu_count()} / {os.getloadavg()[0]:.1f}"),
    ]

    def paired(num: list[float], den: list[float]) -> float:
        return med([n / d for n, d in zip(num, den, strict=True)])

    ratios: dict[str, tuple[float, float | None, str]] = {
        "sync_save_vs_dd": (paired(dd_s, sync_s), 0.8, ">="),
        "load_sha256_vs_cold_read": (paired(cold_s, load_s["sha256"]), None, ""),
        "load_size_vs_cold_read": (paired(cold_s, load_s["size"]), None, ""),
        "async_blocked_vs_sync": (paired(async_blocked_s, sync_s), 0.1, "<="),
        "async_slowdown_vs_sync": (max(0.0, paired(async_stall_s, sync_s)), None, ""),
    }
    width = max(len(name) for name, _ in rows)
    for name, text in rows:
        print(f"{name:<{width}}  {text}")
    print()
    for name, (ratio, target, op) in ratios.items():
        verdict = ""
        if target is not None:
            ok = ratio >= target if op == ">=" else ratio <= target
            verdict = f"  (target {op} {target}: {'ok' if ok else 'MISSED'})"
        print(f"ratio {name:<26} {ratio:6.3f}{verdict}")
    if args.json:
        print(json.dumps({k: v[0] for k, v in ratios.items()}))


def testbed_preemption(args: argparse.Namespace) -> None:
    """Preempt a gpt-tiny job on a running testbed (``scancel --signal=USR2 --batch``) and time its way back.

    Prints the seconds from the signal to the first resumed step (target <= 20 s; the requeue
    itself costs ~12 s on the testbed) and the steps lost (target <= 1), with the phases between.
    """
    from air_hpc.config import load_job
    from air_hpc.launch.submit import submit
    from air_hpc.records.events import read_events
    from air_hpc.records.rundir import RunDir
    from air_hpc.testbed import Testbed
    from air_hpc.train import data
    from air_hpc.train.metrics import read_metrics

    bed = Testbed(Path(args.testbed))
    client = bed.client()
    base = Path(args.dir) if args.dir else REPO / "runs"
    root = Path(tempfile.mkdtemp(dir=base, prefix="bench-preempt-"))
    corpus = root / "corpus.h5"
    data.prepare(data.project_sources(), corpus, data.ByteTokenizer())
    job = load_job(
        REPO / "configs/jobs/gpt-tiny-testbed.yaml",
        [
            f"run.root={root}",
            f"data.path={corpus}",
            "train.steps=12",
            "checkpoint.interval_steps=4",
            "health.preflight=false",
            f"cluster.topology_file={bed.layout.topology_conf}",
        ],
    )
    done = submit(job, "slurm", client)
    run = RunDir(done.run_dir)

    def last_step() -> int:
        return max((int(r["step"]) for r in read_metrics(run.metrics)), default=0)

    def wait(what: str, condition: Any, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise SystemExit(f"bench: timed out waiting for {what}; see {run.path}/logs")
            time.sleep(0.05)

    wait("step 2", lambda: last_step() >= 2)
    trained_before = last_step()
    signalled = time.time()
    client.scancel(done.job_id, signal="USR2", batch=True)
    wait("the resume", lambda: any(e["kind"] == "resume" for e in read_events(run.events)))
    events = read_events(run.events)
    stop = next(e for e in events if e["kind"] == "stop")
    resume = next(e for e in events if e["kind"] == "resume")
    wait("the first resumed step", lambda: last_step() > resume["step"])
    first = next(r for r in read_metrics(run.metrics) if r["step"] == resume["step"] + 1)
    starts = [e["time"] for e in read_events(run.submissions) if e.get("kind") == "started"]
    saved = next(e for e in events if e["kind"] == "checkpoint_saved" and e["step"] == stop["step"])
    lost = max(trained_before, stop["step"]) - resume["step"]
    total = first["time"] - signalled
    rows = [
        ("signal -> ranks agree to stop", f"{stop['time'] - signalled:.1f} s (at step {stop['step']})"),
        ("synchronous save", f"{saved['seconds']:.2f} s"),
        ("exit -> batch script restarted (requeue)", f"{starts[-1] - saved['time']:.1f} s"),
        ("restart -> resumed (imports, process groups, load)", f"{resume['time'] - starts[-1]:.1f} s"),
        ("resumed -> first resumed step done", f"{first['time'] - resume['time']:.1f} s"),
        ("cores / load average", f"{os.cpu_count()} / {os.getloadavg()[0]:.1f}"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    print()
    print(f"seconds signal -> first resumed step  {total:6.1f}  (target <= 20: {'ok' if total <= 20 else 'MISSED'})")
    print(f"steps lost                            {lost:6d}  (target <= 1: {'ok' if lost <= 1 else 'MISSED'})")
    print(f"run directory: {run.path}")
    client.scancel(done.job_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--steps", type=int, default=2, help="training steps per timing window")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dir", help="where to write (default: a temp dir under the repo's runs/)")
    parser.add_argument("--json", action="store_true", help="also print the ratios as one JSON line")
    parser.add_argument(
        "--testbed", metavar="STATE_DIR", help="instead: time a preemption on this running testbed (air-hpc testbed up)"
    )
    parser.add_argument("--worker", type=int, dest="rank", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        worker(args)
        return
    if args.testbed:
        testbed_preemption(args)
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
