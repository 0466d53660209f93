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
from dataclasses import dataclass, field
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


def bench_job(args: argparse.Namespace, workdir: Path) -> Any:
    """The job the ranks train: gpt-tiny-local resized by the command line, TP over all ranks."""
    from air_hpc.config import load_job

    overrides = (
        f"data.path={workdir / 'corpus.h5'}",
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
    return load_job(str(JOB), overrides)


@dataclass
class Rig:
    """One rank's model, step runner and checkpoint store, with the step count that every timing shares."""

    job: Any
    ctx: Any
    model: Any
    runner: Any
    store: Any
    events: Any
    step: int = 0

    def train(self, n: int, ckpt: Any = None) -> float:
        """Seconds for ``n`` steps (polling ``ckpt`` after each), all ranks done."""
        import torch.distributed as dist

        started = time.perf_counter()
        for _ in range(n):
            self.one_step()
            if ckpt is not None:
                ckpt.poll()
        dist.barrier()
        return time.perf_counter() - started

    def one_step(self) -> None:
        self.step += 1
        self.runner.step(self.step * self.job.train.global_batch_size)

    def checkpointer(self, **kwargs: Any) -> Any:
        from air_hpc.resilience.checkpointer import Checkpointer

        return Checkpointer(self.store, kwargs.pop("events", self.events), layout=self.ctx.layout, **kwargs)

    def save(self, ckpt: Any, sync: bool) -> None:
        ckpt.save(self.step, self.model.state(), sync=sync)

    def resume(self, loader: Any) -> None:
        loader.resume(self.model.state())

    def committed_files(self) -> list[Path]:
        latest = self.store.latest_complete(check="size")
        if latest is None:
            raise SystemExit("bench: no committed checkpoint")
        return [p for p in self.store.path(latest).rglob("*") if p.is_file()]


@dataclass
class Timings:
    """Seconds per repeat, each baseline beside ours."""

    dd: list[float] = field(default_factory=list)
    sync: list[float] = field(default_factory=list)
    async_blocked: list[float] = field(default_factory=list)
    async_stall: list[float] = field(default_factory=list)
    cold: list[float] = field(default_factory=list)
    load: dict[str, list[float]] = field(default_factory=lambda: {"sha256": [], "size": []})


def sync_save_s(rig: Rig, ckpt: Any) -> float:
    import torch.distributed as dist

    dist.barrier()
    started = time.perf_counter()
    rig.save(ckpt, sync=True)
    return time.perf_counter() - started


def async_save_s(rig: Rig, ckpt: Any, args: argparse.Namespace, step_s: float) -> tuple[float, float]:
    """The save call, then steps until the save is committed (at least ``--steps``): (loop blocked, stall) s.

    The stall is the extra time over the same number of plain steps."""
    import torch.distributed as dist

    from air_hpc.resilience.signals import agree

    started = time.perf_counter()
    rig.save(ckpt, sync=False)
    blocked = time.perf_counter() - started
    steps = 0
    while steps < args.steps or agree(ckpt.busy):
        rig.one_step()
        polled = time.perf_counter()
        ckpt.poll()
        blocked += time.perf_counter() - polled
        steps += 1
    waited = time.perf_counter()
    ckpt.wait()
    blocked += time.perf_counter() - waited
    dist.barrier()
    return blocked, time.perf_counter() - started - steps * step_s


def time_saves(rig: Rig, args: argparse.Namespace, step_s: float, timings: Timings) -> None:
    """dd, sync and async saves, alternating, so that a machine whose speed drifts (shared disks, other
    jobs) affects both sides of each ratio alike."""
    sync_ckpt = rig.checkpointer(async_save=False)
    async_ckpt = rig.checkpointer(async_save=True)
    sync_save_s(rig, sync_ckpt)  # warm-up; also tells the size for dd
    nbytes = sum(p.stat().st_size for p in rig.committed_files())
    for _ in range(args.repeats):
        rig.train(1)
        if args.rank == 0:
            timings.dd.append(dd_write_s(rig.store.root, nbytes))
        timings.sync.append(sync_save_s(rig, sync_ckpt))
        rig.train(1)
        blocked, stall = async_save_s(rig, async_ckpt, args, step_s)
        timings.async_blocked.append(blocked)
        timings.async_stall.append(stall)


def time_loads(rig: Rig, args: argparse.Namespace, files: list[Path], timings: Timings) -> None:
    """A cold sequential read of the newest checkpoint's files, then its load under each verification."""
    import torch.distributed as dist

    loaders = {c: rig.checkpointer(events=None, async_save=False, verify=c) for c in ("sha256", "size")}
    for _ in range(args.repeats):
        if args.rank == 0:
            timings.cold.append(cold_read_s(files))
        for check, loader in loaders.items():
            if args.rank == 0:
                drop_cache(files)
            dist.barrier()
            started = time.perf_counter()
            rig.resume(loader)
            dist.barrier()
            timings.load[check].append(time.perf_counter() - started)


def build_rig(args: argparse.Namespace, job: Any, ctx: Any) -> Rig:
    """The model, its step runner and a checkpoint store under ``--dir``, the corpus written by rank 0."""
    import torch.distributed as dist

    from air_hpc.data.blend import open_samples
    from air_hpc.records.events import EventLog
    from air_hpc.resilience.store import CheckpointStore
    from air_hpc.train import model as model_mod
    from air_hpc.train import parallel
    from air_hpc.train.loop import StepRunner

    dist.barrier()  # the corpus exists
    parallel.seed(ctx, job.train.seed)
    model = model_mod.build(job, ctx)
    samples = open_samples(job)
    store = CheckpointStore(Path(args.dir) / "checkpoints", keep_last=2)
    events = EventLog(Path(args.dir) / "events.jsonl")
    return Rig(job, ctx, model, StepRunner(job, ctx, model, samples), store, events)


def print_phases(events_path: Path) -> None:
    from air_hpc.records.events import read_events

    saved = [e for e in read_events(events_path) if e["kind"] == "checkpoint_saved"]
    for kind in (False, True):
        last = [e for e in saved if e["async"] is kind][-1]
        print(f"phases of the last {'async' if kind else 'sync'} save (s): {last['phases']}")


def worker(args: argparse.Namespace) -> None:
    import contextlib

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    from air_hpc.backend import megatron_compat
    from air_hpc.train import parallel
    from air_hpc.train.data import ByteTokenizer, prepare

    job = bench_job(args, Path(args.dir))
    corpus = job.data.path
    if corpus is None:
        raise SystemExit("ckpt.py: the bench job needs data.path (one corpus file)")
    if args.rank == 0 and not corpus.exists():
        prepare([REPO / "README.md", REPO / "configs" / "jobs" / "gpt-tiny-local.yaml"], corpus, ByteTokenizer())
    env = parallel.DistEnv(args.rank, args.ranks, args.rank, "127.0.0.1", args.port, "localhost")
    with contextlib.ExitStack() as stack:
        stack.enter_context(megatron_compat.cpu_patched())
        ctx = stack.enter_context(parallel.distributed(env, job.layout, "gloo", 600))
        rig = build_rig(args, job, ctx)
        rig.train(2)
        step_s = statistics.median(rig.train(args.steps) for _ in range(3)) / args.steps
        timings = Timings()
        time_saves(rig, args, step_s, timings)
        files = rig.committed_files()
        time_loads(rig, args, files, timings)
        if args.rank == 0:
            nbytes = sum(p.stat().st_size for p in files)
            report(args, nbytes, len(files), step_s, timings)
            print_phases(rig.events.path)
        dist.barrier()


def report(args: argparse.Namespace, nbytes: int, nfiles: int, step_s: float, timings: Timings) -> None:
    mb = nbytes / 1e6
    med = statistics.median
    dd_s, sync_s, cold_s, load_s = timings.dd, timings.sync, timings.cold, timings.load
    async_blocked_s, async_stall_s = timings.async_blocked, timings.async_stall
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


def testbed_job(args: argparse.Namespace, bed: Any) -> Any:
    """gpt-tiny for the testbed, 12 steps, a checkpoint every 4, in a fresh directory under ``--dir``."""
    from air_hpc.config import load_job
    from air_hpc.train import data

    base = Path(args.dir) if args.dir else REPO / "runs"
    root = Path(tempfile.mkdtemp(dir=base, prefix="bench-preempt-"))
    corpus = root / "corpus.h5"
    data.prepare(data.project_sources(), corpus, data.ByteTokenizer())
    return load_job(
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


def print_preemption(run: Any, signalled: float, trained_before: int) -> None:
    """The phases from the signal to the first resumed step, and the two targets."""
    from air_hpc.records.events import read_events
    from air_hpc.records.metrics import read_metrics

    events = read_events(run.events)
    stop = next(e for e in events if e["kind"] == "stop")
    resume = next(e for e in events if e["kind"] == "resume")
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


def testbed_preemption(args: argparse.Namespace) -> None:
    """Preempt a gpt-tiny job on a running testbed (``scancel --signal=USR2 --batch``) and time its way back.

    Prints the seconds from the signal to the first resumed step (target <= 20 s; the requeue
    itself costs ~12 s on the testbed) and the steps lost (target <= 1), with the phases between.
    """
    from air_hpc.launch.submit import submit
    from air_hpc.records.events import read_events
    from air_hpc.records.metrics import read_metrics
    from air_hpc.records.rundir import RunDir
    from air_hpc.testbed import Testbed

    bed = Testbed(Path(args.testbed))
    client = bed.client()
    done = submit(testbed_job(args, bed), "slurm", client)
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
    resumed = next(e for e in read_events(run.events) if e["kind"] == "resume")["step"]
    wait("the first resumed step", lambda: last_step() > resumed)
    print_preemption(run, signalled, trained_before)
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
