#!/usr/bin/env python3
"""Fault campaign benchmark: 8 mixed faults into gpt-tiny on the testbed, fault-to-resume against requeue.

Runs ``air-hpc chaos`` (gpt-tiny TP2xPP2 on two nodes beside an untouched reference run) with 8
faults of the kinds the testbed can inject, and prints each fault (detection, resume, steps lost),
then for each kind its mean fault-to-resume time (fault to the end of the first step after it) as a
ratio against the requeue path measured in the same campaign: the ``preempt`` faults (signal,
synchronous save, requeue, start, load). Below 1: that kind recovers faster than a requeue. Also
the goodput of both runs and whether nothing was lost.

Not run in CI (several minutes on 2 cores). Usage:
``scripts/bench/chaos.py [--state-dir DIR] [--seed S] [--faults KINDS] [--count N] [--dir RUNS]``.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "configs/jobs/gpt-tiny-testbed.yaml"
BASELINE_KIND = "preempt"
#: Every kind the testbed can strike.
DEFAULT_FAULTS = "preempt,slurm-preempt,rank-kill,hang,straggler,ckpt-kill"
#: gpt-tiny trains a step in well under a second: with fewer steps the run ends before the last faults.
STEPS_PER_FAULT = 8


def campaign(state_dir: str | None, runs: Path, faults: str, count: int, seed: int, steps: int) -> dict[str, Any]:
    corpus = runs / "corpus.h5"
    if not corpus.exists():
        subprocess.run(
            [sys.executable, "-m", "air_hpc", "data", "prepare", "--project", "--output", str(corpus)],
            check=True,
            cwd=REPO,
        )
    overrides = [
        f"run.root={runs}",
        f"data.path={corpus}",
        f"train.steps={steps}",
        "checkpoint.interval_steps=3",
        "checkpoint.keep_last=10",
        "health.preflight=false",
        "health.heartbeat_step_s=15",
        "resilience.max_restarts=12",
    ]
    argv = [sys.executable, "-m", "air_hpc", "chaos", str(JOB), "--faults", faults, "--count", str(count)]
    argv += ["--seed", str(seed), "--json", *(a for o in overrides for a in ("--set", o))]
    if state_dir:
        argv += ["--state-dir", state_dir]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO)
    if not done.stdout.strip():
        raise SystemExit(f"bench: air-hpc chaos printed nothing (exit {done.returncode}): {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", default=os.environ.get("AIR_HPC_TEST_STATE_DIR"))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", default=DEFAULT_FAULTS)
    parser.add_argument("--count", type=int, default=8)
    parser.add_argument(
        "--steps", type=int, default=None, help=f"Training steps (default: {STEPS_PER_FAULT} per fault, at least 24)."
    )
    parser.add_argument("--dir", type=Path, default=None, help="Where the runs go (default: a temporary directory).")
    args = parser.parse_args()
    if BASELINE_KIND not in args.faults.split(","):
        raise SystemExit(f"bench: --faults must include {BASELINE_KIND}, the requeue baseline")
    runs = args.dir or Path(tempfile.mkdtemp(prefix="bench-chaos-"))
    steps = args.steps or max(24, STEPS_PER_FAULT * args.count)
    result = campaign(args.state_dir, runs.resolve(), args.faults, args.count, args.seed, steps)
    if "error" in result:
        raise SystemExit(f"bench: {result['error']}")
    print(f"{'#':>2} {'kind':<13} {'detected':>9} {'resumed':>9} {'steps':>5} {'lost':>8}  target")
    for f in result["faults"]:
        if f["skipped"]:
            print(f"{f['number']:>2} {f['kind']:<13} skipped: {f['skipped']}")
            continue
        detected, resumed, lost = (_seconds(f[key]) for key in ("detected_after_s", "resumed_after_s", "seconds_lost"))
        times = f"{detected:>9} {resumed:>9} {f['steps_lost']:>5} {lost:>8}"
        print(f"{f['number']:>2} {f['kind']:<13} {times}  {f['target']}")
    by_kind: dict[str, list[float]] = defaultdict(list)
    for fault in result["faults"]:
        if fault["resumed_after_s"] is not None:
            by_kind[fault["kind"]].append(fault["resumed_after_s"])
    if not by_kind.get(BASELINE_KIND):
        raise SystemExit("bench: no preempt fault recovered; no baseline to compare with")
    baseline = statistics.mean(by_kind[BASELINE_KIND])
    print(f"{'kind':<13} {'faults':>6} {'fault-to-resume / requeue':>26}")
    for kind, times in sorted(by_kind.items()):
        print(f"{kind:<13} {len(times):>6} {statistics.mean(times) / baseline:>26.2f}")
    recovered = sum(len(t) for t in by_kind.values())
    skipped = sum(bool(f["skipped"]) for f in result["faults"])
    print(f"recovered {recovered} of {len(result['faults'])} faults ({skipped} skipped)")
    print(f"final state {result['final_state']}")
    goodput, reference = result["goodput"], result["reference_goodput"]
    if goodput and reference:
        print(f"goodput chaos / reference: {goodput / reference:.2f}")
    print(f"lost {result['steps_lost']} step(s), {result['seconds_lost']:.1f}s; wall beyond the reference", end=" ")
    print(_seconds(result["extra_wall_s"]))
    print(result["verdict"])


if __name__ == "__main__":
    main()
