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
- a second baseline, the floor: ``import torch, torch._dynamo, torch.distributed.checkpoint`` with
  the GC off: what a rank that steps a ``torch.optim`` optimizer (which imports TorchDynamo) and
  loads a checkpoint imports at least; no start can go below it;
- the ratio start / baseline (below 1: the start now takes less than the old imports alone), in
  wall time and in CPU seconds per rank; the CPU ratio holds on a machine busy with other work,
  where wall times stretch with the load;
- each phase's CPU seconds (median rank), and the CPU floor of the wall time: the ranks' CPU
  seconds over the machine's cores, which even an idle machine of this size cannot beat.

Usage: ``scripts/bench/startup.py [--state-dir DIR] [--preflight] [--dir RUNS]``; the state dir
defaults to ``$AIR_HPC_TEST_STATE_DIR`` or the testbed's default.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "configs/jobs/gpt-tiny-testbed.yaml"
TARGET_S = 8.0


#: The baselines, run as as many concurrent processes as the job has ranks: the old start's imports
#: (megatron-core with its import-time ``torch.compile``), and the floor: what any rank that steps a
#: ``torch.optim`` optimizer (its ``step`` imports TorchDynamo) and loads a ``torch.distributed.checkpoint``
#: must import, with the cyclic GC off as in a rank's start; no start can go below it.
BASELINES = {
    "import torch, megatron.core": "bare torch + megatron.core",
    "import gc; gc.disable(); import torch, torch._dynamo, torch.distributed.checkpoint": "floor: torch+dynamo+dcp",
}


def bare_imports(code: str, ranks: int) -> tuple[float, float]:
    """Wall time of ``ranks`` concurrent ``python -c code`` processes; their median CPU seconds.

    Each ends with ``os._exit``: the interpreter's teardown of torch costs CPU seconds that a
    rank's start (measured up to its first step) never pays.
    """
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    started = time.perf_counter()
    argv = [sys.executable, "-c", f"{code}; import os; os._exit(0)"]
    procs = [subprocess.Popen(argv, env=env, stderr=subprocess.DEVNULL) for _ in range(ranks)]
    cpu = []
    for proc in procs:
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"bench: the bare {code!r} failed")
        proc.returncode = 0
        cpu.append(usage.ru_utime + usage.ru_stime)
    return time.perf_counter() - started, statistics.median(cpu)


def timed_start(bed: Any, root: Path, corpus: Path, steps: int, preflight: bool) -> dict[str, Any]:
    """Submit gpt-tiny to ``steps`` (resuming whatever the run directory holds); its start-up, once it ended."""
    from air_hpc.config import load_job
    from air_hpc.launch.submit import submit
    from air_hpc.records.events import EventKind
    from air_hpc.records.jsonl import read_jsonl
    from air_hpc.records.metrics import read_metrics
    from air_hpc.records.rundir import RunDir
    from air_hpc.slurm.jobs import JobState

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
    event = [e for e in read_jsonl(run.events) if e["kind"] == EventKind.STARTUP][-1]
    first = [r for r in read_metrics(run.metrics) if r["step"] == event["step"]][-1]
    return {
        "batch_to_step_s": first["time"] - first["step_time_s"] - started,
        "slowest": {phase: max(seconds) for phase, seconds in event["phases_s"].items()},
        "cpu_phases": {phase: statistics.median(seconds) for phase, seconds in event["cpu_phases_s"].items()},
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
    load_before = os.getloadavg()[0]
    before = {code: bare_imports(code, ranks) for code in BASELINES}
    fresh = timed_start(bed, root, corpus, steps=3, preflight=args.preflight)
    resumed = timed_start(bed, root, corpus, steps=5, preflight=args.preflight)
    after = {code: bare_imports(code, ranks) for code in BASELINES}
    baselines = {code: tuple((b + a) / 2 for b, a in zip(before[code], after[code], strict=True)) for code in BASELINES}
    print(
        f"gpt-tiny TP2xPP2, {ranks} ranks on 2 testbed nodes; {os.cpu_count()} cores, "
        f"load {load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
    )
    report(PHASES, (fresh, resumed), baselines, ranks)
    print(f"runs in {root}")


def report(phases: tuple[str, ...], starts: tuple[dict[str, Any], ...], baselines: dict[str, Any], ranks: int) -> None:
    """Phases (wall: slowest rank, CPU: median rank), the ratios to the baselines, then the target check."""
    cores = os.cpu_count() or 1

    def row(label: str, values: list[float], unit: str = "s") -> None:
        print(f"{label:<40}" + "".join(f"{v:>9.2f}{unit}" for v in values))

    print(f"{'':<40}{'first start':>20}{'resume':>20}")
    print(f"{'phase':<40}" + f"{'wall':>10}{'CPU':>10}" * 2)
    for phase in phases:
        row(f"  {phase}", [v for s in starts for v in (s["slowest"][phase], s["cpu_phases"][phase])])
    row("process start -> first step", [v for s in starts for v in (s["to_first_step_s"], s["cpu_s"])])
    row("batch script -> first step (wall)", [v for s in starts for v in (s["batch_to_step_s"], s["cpu_s"])])
    floors = [ranks * s["cpu_s"] / cores for s in starts]
    print(
        f"CPU floor of the wall time ({ranks} ranks x CPU per rank / {cores} cores): "
        + ", ".join(f"{f:.2f} s" for f in floors)
    )
    print(f"baselines, same run ({ranks} concurrent processes each; wall, median CPU per process):")
    for code, (wall, cpu) in baselines.items():
        print(f"  {BASELINES[code]:<38}{wall:>9.2f}s{cpu:>9.2f}s")
    print("ratio start / baseline (wall: batch script -> first step; CPU: per rank to the first step):")
    for code, (wall, cpu) in baselines.items():
        row(f"  / {BASELINES[code]}", [v for s in starts for v in (s["batch_to_step_s"] / wall, s["cpu_s"] / cpu)], "x")
    worst = max(s["batch_to_step_s"] for s in starts)
    verdict = "ok" if worst <= TARGET_S else "MISSED"
    if worst > TARGET_S and os.getloadavg()[0] > cores:
        verdict += f" (load above {cores}: other work stretched the wall times; judge by CPU and ratios)"
    print(
        f"target batch script -> first step <= {TARGET_S:g} s: {verdict} (slowest start {worst:.2f} s; "
        f"its CPU floor on this machine {max(floors):.2f} s)"
    )


if __name__ == "__main__":
    main()
