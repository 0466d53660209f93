#!/usr/bin/env python3
"""Start-up benchmark: gpt-tiny on the testbed, from the batch script's start to the first step, by phase.

Runs, on a running testbed (``air-hpc testbed up``), one fresh start of gpt-tiny TP2xPP2 on two
nodes and one resumed start of the same run (it loads the first start's final checkpoint),
each through the rendered batch script, and prints for both:

- each phase of the slowest rank (from the ranks' ``startup`` event: launch, imports, preflight,
  rendezvous, model, resume, data, first step), and the batch script's start -> first step
  (target <= 8 s on an idle testbed);
- the baseline, measured in the same run on the same machine: as many bare
  ``python -c 'import torch, megatron.core'`` processes as the job has ranks, started together,
  until the last one is done: the floor of every start before the deferred ``torch.compile``
  (the old start paid that and then Megatron init, rendezvous, build and load on top);
- the ratio start / baseline (below 1: the start now takes less than the old imports alone), in
  wall time and in CPU seconds per rank; the CPU ratio holds on a machine busy with other work,
  where wall times stretch with the load.

Usage: ``scripts/bench/startup.py [--state-dir DIR] [--preflight] [--dir RUNS]``; the state dir
defaults to ``$AIR_HPC_TEST_STATE_DIR`` or the testbed's default.
"""

import os
import sys

# This directory is sys.path[0] when the script runs, and it holds select.py, which would shadow
# the standard library's select module (imported by socket and subprocess).
sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != os.path.dirname(os.path.realpath(__file__))]

import argparse  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "configs/jobs/gpt-tiny-testbed.yaml"
TARGET_S = 8.0


def bare_imports(ranks: int) -> tuple[float, float]:
    """Wall time of ``ranks`` concurrent bare ``import torch, megatron.core`` processes; their median CPU seconds."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    started = time.perf_counter()
    procs = [
        subprocess.Popen([sys.executable, "-c", "import torch, megatron.core"], env=env, stderr=subprocess.DEVNULL)
        for _ in range(ranks)
    ]
    cpu = []
    for proc in procs:
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit("bench: the bare import failed")
        proc.returncode = 0
        cpu.append(usage.ru_utime + usage.ru_stime)
    return time.perf_counter() - started, statistics.median(cpu)


def timed_start(bed: Any, root: Path, corpus: Path, steps: int, preflight: bool) -> dict[str, Any]:
    """Submit gpt-tiny to ``steps`` (resuming whatever the run directory holds); its start-up, once it ended."""
    from air_hpc.config import load_job
    from air_hpc.launch.submit import submit
    from air_hpc.records.jsonl import read_jsonl
    from air_hpc.records.rundir import RunDir
    from air_hpc.slurm.jobs import JobState
    from air_hpc.train.startup import EVENT_KIND

    client = bed.client()
    job = load_job(
        JOB,
        [
            f"run.root={root}",
            f"data.path={corpus}",
            f"train.steps={steps}",
            "checkpoint.interval_steps=100",
            f"health.preflight={str(preflight).lower()}",
            f"cluster.topology_file={bed.layout.topology_conf}",
        ],
    )
    done = submit(job, "slurm", client)
    deadline = time.monotonic() + 600
    while True:
        status = client.job_status(done.job_id)
        if status is not None and status.state.terminal:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: job {done.job_id} did not end in 600 s; see {done.run_dir}/logs")
        time.sleep(0.5)
    if status.state != JobState.COMPLETED:
        raise SystemExit(f"bench: job {done.job_id} ended {status.state}; see {done.run_dir}/logs")
    run = RunDir(done.run_dir)
    started = [r["time"] for r in read_jsonl(run.submissions) if r.get("kind") == "started"][-1]
    event = [e for e in read_jsonl(run.events) if e["kind"] == EVENT_KIND][-1]
    first = [r for r in read_jsonl(run.metrics) if r["step"] == event["step"]][-1]
    return {
        "batch_to_step_s": first["time"] - first["step_time_s"] - started,
        "slowest": {phase: max(seconds) for phase, seconds in event["phases_s"].items()},
        "to_first_step_s": event["to_first_step_s"],
        "cpu_s": statistics.median(event["cpu_to_first_step_s"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", default=os.environ.get("AIR_HPC_TEST_STATE_DIR"), help="the testbed's state")
    parser.add_argument("--preflight", action="store_true", help="include the pre-flight health check")
    parser.add_argument("--dir", help="where to put the runs (default: runs/ of this repository)")
    args = parser.parse_args()

    from air_hpc.testbed import Testbed
    from air_hpc.train import data
    from air_hpc.train.startup import PHASES

    bed = Testbed(Path(args.state_dir)) if args.state_dir else Testbed()
    os.environ.update(bed.env)
    base = Path(args.dir) if args.dir else REPO / "runs"
    base.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(dir=base, prefix="bench-startup-"))
    corpus = root / "corpus.h5"
    data.prepare(data.project_sources(), corpus, data.ByteTokenizer())

    ranks = 4
    wall_before, cpu_before = bare_imports(ranks)
    fresh = timed_start(bed, root, corpus, steps=3, preflight=args.preflight)
    resumed = timed_start(bed, root, corpus, steps=5, preflight=args.preflight)
    wall_after, cpu_after = bare_imports(ranks)
    floor, floor_cpu = (wall_before + wall_after) / 2, (cpu_before + cpu_after) / 2

    print(f"gpt-tiny TP2xPP2, {ranks} ranks on 2 testbed nodes; {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    print(f"{'phase (slowest rank)':<34}{'first start':>12}{'resume':>12}")
    for phase in PHASES:
        print(f"  {phase:<32}{fresh['slowest'][phase]:>11.2f}s{resumed['slowest'][phase]:>11.2f}s")
    print(f"{'process start -> first step':<34}{fresh['to_first_step_s']:>11.2f}s{resumed['to_first_step_s']:>11.2f}s")
    print(f"{'batch script -> first step':<34}{fresh['batch_to_step_s']:>11.2f}s{resumed['batch_to_step_s']:>11.2f}s")
    print(f"{'baseline: bare import x' + str(ranks):<34}{floor:>11.2f}s{'':>12}")
    ratios = [start["batch_to_step_s"] / floor for start in (fresh, resumed)]
    print(f"{'ratio start / baseline (wall)':<34}{ratios[0]:>11.2f}x{ratios[1]:>11.2f}x")
    print(f"{'CPU s per rank to first step':<34}{fresh['cpu_s']:>11.2f}s{resumed['cpu_s']:>11.2f}s")
    print(f"{'baseline: CPU s per bare import':<34}{floor_cpu:>11.2f}s{'':>12}")
    cpu_ratios = [start["cpu_s"] / floor_cpu for start in (fresh, resumed)]
    print(f"{'ratio start / baseline (CPU)':<34}{cpu_ratios[0]:>11.2f}x{cpu_ratios[1]:>11.2f}x")
    worst = max(fresh["batch_to_step_s"], resumed["batch_to_step_s"])
    print(f"target batch script -> first step <= {TARGET_S:g} s: {'ok' if worst <= TARGET_S else 'MISSED'}")
    print(f"runs in {root}")


if __name__ == "__main__":
    main()
