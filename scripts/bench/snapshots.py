#!/usr/bin/env python3
"""In-memory snapshots: what they cost a step, what they hold in host memory, and what they save on a fault.

Local mode (default): ``--ranks`` gloo CPU ranks train a Megatron-core GPT (real ``StepRunner``,
real model and optimizer), each rank on its own emulated node with a real holder process
(``python -m air_hpc.runtime.snapholder``), so every snapshot also goes to a buddy on the other
node. Blocks of ``--steps`` steps without and with a snapshot after every step alternate
``--repeats`` times; it prints

- the step time with snapshots every step over the step time without (target <= 1.03x), the
  median of the per-block ratios (the training-side stall alone, the host copy, is printed too);
- the extra host memory per rank (its capture buffer plus what its node's holder keeps: its own
  and its buddy's snapshot of the two newest steps) over the rank's shard (the snapshot's size).

``--testbed STATE_DIR``: on a running testbed, two gpt-tiny jobs with a spare
(``resources.spare_nodes: 1``), one with ``checkpoint.memory_interval_steps: 1`` and one without,
each lose their last rank (``kill -9``) two steps after the checkpoint of step 3; prints for each
the seconds from the fault to the first resumed step and the steps trained again, and the ratio
memory / persistent.

Usage: ``scripts/bench/snapshots.py [--ranks 2] [--hidden 512] [--layers 4] [--steps 8] [--repeats 3]``
or ``scripts/bench/snapshots.py --testbed /tmp/tb``.
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
LOCAL_JOB = REPO / "configs" / "jobs" / "gpt-tiny-local.yaml"
TESTBED_JOB = REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml"


def bench_job(args: argparse.Namespace, workdir: Path) -> Any:
    from air_hpc.config import load_job

    return load_job(
        str(LOCAL_JOB),
        [
            f"data.path={workdir / 'corpus.h5'}",
            f"run.root={workdir}",
            "run.name=bench",
            f"resources.tasks_per_node={args.ranks}",
            "parallel.tp=1",
            "parallel.pp=1",
            f"model.hidden_size={args.hidden}",
            f"model.num_layers={args.layers}",
            f"model.ffn_hidden_size={4 * args.hidden}",
            "model.num_attention_heads=8",
            f"train.global_batch_size={2 * args.ranks}",
            "train.micro_batch_size=2",
        ],
    )


def _block(runner: Any, model: Any, snaps: Any, steps: int, consumed: int, batch: int) -> tuple[float, int]:
    import torch.distributed as dist

    dist.barrier()
    started = time.perf_counter()
    for _ in range(steps):
        runner.step(consumed)
        consumed += batch
        if snaps is not None:
            snaps.after_step(consumed, model.state().at(consumed_samples=consumed))
    if snaps is not None:
        snaps.wait()
    dist.barrier()
    return (time.perf_counter() - started) / steps, consumed


def worker(args: argparse.Namespace) -> None:
    import contextlib

    import torch

    torch.set_num_threads(1)
    from air_hpc.backend import megatron_compat
    from air_hpc.data.blend import open_samples
    from air_hpc.resilience.holder import HolderClient, socket_path
    from air_hpc.resilience.memory import MemorySnapshots
    from air_hpc.train import model as model_mod
    from air_hpc.train import parallel
    from air_hpc.train.loop import StepRunner

    workdir = Path(args.dir)
    job = bench_job(args, workdir)
    env = parallel.DistEnv(args.rank, args.ranks, args.rank, "127.0.0.1", args.port, f"b{args.rank}")
    with contextlib.ExitStack() as stack:
        stack.enter_context(megatron_compat.cpu_patched())
        ctx = stack.enter_context(parallel.distributed(env, job.layout, "gloo", 600))
        parallel.seed(ctx, job.train.seed)
        model = model_mod.build(job, ctx)
        runner = StepRunner(job, ctx, model, open_samples(job))
        hosts = [f"b{r}" for r in range(args.ranks)]
        holder = HolderClient(socket_path(Path(args.holders), f"b{args.rank}"))
        snaps = MemorySnapshots(1, ctx.layout, hosts, holder, None)
        batch, consumed = job.train.global_batch_size, 0
        _, consumed = _block(runner, model, snaps, 2, consumed, batch)  # warm-up, both paths
        plain, with_snaps, stalls, ships = [], [], [], []
        for _ in range(args.repeats):
            step_s, consumed = _block(runner, model, None, args.steps, consumed, batch)
            plain.append(step_s)
            before, shipped = snaps.stall_s, snaps.ship_s
            step_s, consumed = _block(runner, model, snaps, args.steps, consumed, batch)
            with_snaps.append(step_s)
            stalls.append((snaps.stall_s - before) / args.steps)
            ships.append((snaps.ship_s - shipped) / args.steps)
        held = holder.held_bytes()
        xxh3_s, sha256_s = _checksums(snaps)
        result = {
            "rank": args.rank,
            "plain_s": plain,
            "snap_s": with_snaps,
            "stall_s": stalls,
            "ship_s": ships,
            "shard_bytes": snaps.shard_bytes,
            "holder_bytes": held,
            "failures": snaps.failures,
            "xxh3_s": xxh3_s,
            "sha256_s": sha256_s,
        }
        (workdir / f"rank-{args.rank}.json").write_text(json.dumps(result))
        snaps.close()


def _checksums(snaps: Any) -> tuple[float, float]:
    """The snapshot's checksum (XXH3-128) over one shard vs sha256 over the same bytes, best of three each."""
    import hashlib

    import xxhash

    data = memoryview(snaps._buffer.numpy())
    timed = []
    for digest in (xxhash.xxh3_128, hashlib.sha256):
        best = float("inf")
        for _ in range(3):
            began = time.perf_counter()
            digest(data).digest()
            best = min(best, time.perf_counter() - began)
        timed.append(best)
    return timed[0], timed[1]


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    ratios = [s / p for s, p in zip(results[0]["snap_s"], results[0]["plain_s"], strict=True)]
    plain = statistics.median(results[0]["plain_s"])
    stall = statistics.median(results[0]["stall_s"])
    shard = max(r["shard_bytes"] for r in results)
    extra = max(r["shard_bytes"] + r["holder_bytes"] for r in results)  # one rank per node here
    print(f"gpt hidden {args.hidden} x {args.layers} layers on {args.ranks} gloo ranks, one per emulated node")
    print(f"step time without snapshots: {plain * 1000:.1f} ms (median of {args.repeats} blocks of {args.steps})")
    ratio = statistics.median(ratios)
    print(f"step time with a snapshot every step / without: {ratio:.3f}x (target <= 1.03x)")
    ship = statistics.median(results[0]["ship_s"])
    print(f"  training thread in after_step (host copy + wait for the previous): {stall * 1000:.1f} ms a step")
    print(f"  background thread (XXH3 checksum, buddy exchange, holder puts): {ship * 1000:.1f} ms a step")
    print(f"  cores: {os.cpu_count()}, load average {os.getloadavg()[0]:.1f} (the background work needs idle cores)")
    print(f"shard (one rank's snapshot): {shard / 2**20:.1f} MiB")
    xxh3_s, sha256_s = results[0]["xxh3_s"], results[0]["sha256_s"]
    print(
        f"  its checksum (taken after every snapshot, checked on every restore): XXH3-128 {xxh3_s * 1000:.1f} ms, "
        f"{xxh3_s / sha256_s:.2f}x sha256's {sha256_s * 1000:.1f} ms"
    )
    print(
        f"extra host memory per rank / shard: {extra / shard:.2f}x (capture buffer + own and buddy copies of 2 steps)"
    )
    if any(r["failures"] for r in results):
        print(f"snapshots not stored: {[r['failures'] for r in results]}")
    if args.json:
        print(json.dumps({"step_ratio": ratio, "memory_ratio": extra / shard, "shard_bytes": shard}))


def local(args: argparse.Namespace) -> None:
    from air_hpc.train.data import ByteTokenizer, prepare

    workdir = Path(tempfile.mkdtemp(prefix="snap-bench-", dir=args.dir))
    prepare(
        [REPO / "README.md", REPO / "configs" / "jobs" / "gpt-tiny-local.yaml"], workdir / "corpus.h5", ByteTokenizer()
    )
    holders_dir = Path("/tmp") / f"air-hpc-bench-{os.getpid()}"
    holders = [
        subprocess.Popen([sys.executable, "-m", "air_hpc.runtime.snapholder", str(holders_dir), f"b{r}"])
        for r in range(args.ranks)
    ]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = [sys.executable, __file__, *sys.argv[1:], "--dir", str(workdir), "--holders", str(holders_dir)]
    try:
        ranks = [subprocess.Popen([*base, "--worker", str(r), "--port", str(port)]) for r in range(args.ranks)]
        codes = [p.wait() for p in ranks]
    finally:
        for proc in holders:
            proc.terminate()
            proc.wait()
    if any(codes):
        raise SystemExit(f"snapshots.py: a rank failed: {codes}")
    report([json.loads((workdir / f"rank-{r}.json").read_text()) for r in range(args.ranks)], args)


# -- testbed: fault to first resumed step -----------------------------------------------------------
def _events(run_dir: Any, kind: str) -> list[dict[str, Any]]:
    from air_hpc.records.events import read_events

    return [e for e in read_events(run_dir.events) if e["kind"] == kind]


def _wait(what: str, condition: Any, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"snapshots.py: timed out waiting for {what}")
        time.sleep(0.05)


def _last_step(run_dir: Any) -> int:
    from air_hpc.records.metrics import read_metrics

    rows = read_metrics(run_dir.metrics)
    return max((r["step"] for r in rows), default=0)


def one_fault(testbed: Any, corpus: Path, root: Path, memory: bool) -> tuple[float, int]:
    """Seconds from killing the last rank after step 5 to the first resumed step, and the steps trained again."""
    import psutil

    from air_hpc.config.load import load_job
    from air_hpc.health.heartbeat import read_beats
    from air_hpc.launch.submit import submit
    from air_hpc.records.metrics import read_metrics
    from air_hpc.records.rundir import RunDir

    name = "bench-mem" if memory else "bench-ckpt"
    job = load_job(
        TESTBED_JOB,
        [
            f"run.name={name}",
            f"run.root={root}",
            f"data.path={corpus}",
            "train.steps=10",
            "checkpoint.interval_steps=3",
            "health.preflight=false",
            f"cluster.topology_file={testbed.layout.topology_conf}",
            "resources.spare_nodes=1",
            f"checkpoint.memory_interval_steps={1 if memory else 0}",
        ],
    )
    done = submit(job, "slurm", testbed.client())
    run_dir = RunDir(done.run_dir)
    _wait("step 5", lambda: _last_step(run_dir) >= 5)
    trained = _last_step(run_dir)
    generation = _events(run_dir, "step_started")[-1]["generation"]
    beats = read_beats(run_dir.heartbeat / generation)
    proc = psutil.Process(beats[max(beats)].pid)
    if str(run_dir.path) not in " ".join(proc.cmdline()):
        raise SystemExit("snapshots.py: the highest rank's heartbeat names another process")
    faulted = time.time()
    proc.kill()
    kind = "memory_resume" if memory else "resume"
    _wait(f"a {kind}", lambda: _events(run_dir, kind) and _last_step(run_dir) > _events(run_dir, kind)[-1]["step"])
    resumed = _events(run_dir, kind)[-1]["step"]
    first = next(r for r in read_metrics(run_dir.metrics) if r["step"] == resumed + 1 and r["time"] > faulted)
    client = testbed.client()

    def ended() -> bool:
        status = client.job_status(done.job_id)
        return status is None or status.state.terminal

    _wait("the job to end", ended)
    return first["time"] - faulted, trained - resumed


def on_testbed(args: argparse.Namespace) -> None:
    from air_hpc.testbed.cluster import Testbed
    from air_hpc.train.data import ByteTokenizer, prepare, project_sources

    testbed = Testbed(Path(args.testbed))
    root = Path(tempfile.mkdtemp(prefix="snap-bench-", dir=args.dir))
    corpus = root / "corpus.h5"
    prepare(project_sources(), corpus, ByteTokenizer())
    memory_s, memory_lost = one_fault(testbed, corpus, root, memory=True)
    ckpt_s, ckpt_lost = one_fault(testbed, corpus, root, memory=False)
    print(f"rank-kill after step 5, checkpoint every 3 steps, one spare (testbed {args.testbed}):")
    print(f"  from memory:     {memory_s:5.1f} s to the first resumed step, {memory_lost} step(s) trained again")
    print(f"  from checkpoint: {ckpt_s:5.1f} s to the first resumed step, {ckpt_lost} step(s) trained again")
    print(f"  fault to first resumed step, memory / persistent: {memory_s / ckpt_s:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8, help="steps per timed block")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", help="where to write (default: the system's temp dir)")
    parser.add_argument("--json", action="store_true", help="also print the ratios as one JSON line")
    parser.add_argument("--testbed", metavar="STATE_DIR", help="instead: fault to first resumed step on this testbed")
    parser.add_argument("--worker", type=int, dest="rank", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--holders", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        worker(args)
    elif args.testbed:
        on_testbed(args)
    else:
        local(args)


if __name__ == "__main__":
    main()
