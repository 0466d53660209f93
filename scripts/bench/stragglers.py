#!/usr/bin/env python3
"""False straggler alarms on clean runs: the ratio alone against persistence plus a noise margin.

On a running testbed (``air-hpc testbed up``), clean gpt-tiny runs (nothing slowed) train side by
side, half under the old rule (``health.straggler_windows=1``, ``health.straggler_noise_sigmas=0``:
one window over ``straggler_ratio`` is a verdict) and half under the defaults (two windows in a row,
and a margin of ``straggler_noise_sigmas`` times the other nodes' step-to-step noise). Every
``straggler`` event of a clean run is a false alarm; it prints, per rule, the runs with one and the
checked windows, and the ratio of the two rates.

Usage: ``scripts/bench/stragglers.py --testbed STATE_DIR [--runs 2] [--steps 40] [--window 5]``.
"""

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml"
RULES = {"ratio alone": ["health.straggler_windows=1", "health.straggler_noise_sigmas=0"], "default": []}


def submit_runs(args: argparse.Namespace) -> tuple[Any, list[tuple[str, Any]]]:
    """Every run submitted at once: (client, [(rule, submission)])."""
    from air_hpc.config.load import load_job
    from air_hpc.launch.submit import submit
    from air_hpc.testbed import Testbed
    from air_hpc.train import data

    bed = Testbed(args.testbed)
    if not bed.status()["up"]:
        raise SystemExit(f"bench: no testbed running in {args.testbed}; run `air-hpc testbed up` first")
    os.environ.update(bed.env)
    work = Path(tempfile.mkdtemp(prefix="air-hpc-bench-stragglers-"))
    corpus = data.prepare(data.project_sources(), work / "corpus.h5", data.ByteTokenizer()).path
    client = bed.client()
    submitted = []
    for number in range(args.runs):
        for rule, overrides in RULES.items():
            job = load_job(
                JOB,
                [
                    f"run.root={work}",
                    f"run.name=clean-{number}-{'old' if overrides else 'new'}",
                    f"data.path={corpus}",
                    f"train.steps={args.steps}",
                    "checkpoint.interval_steps=1000",
                    "health.preflight=false",
                    "placement.topology_aware=false",
                    f"health.straggler_window_steps={args.window}",
                    *overrides,
                ],
            )
            submitted.append((rule, submit(job, "slurm", client)))
    return client, submitted


def main() -> None:
    from air_hpc.records.events import read_events
    from air_hpc.records.rundir import RunDir

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--testbed", type=Path, required=True, help="state directory of a running testbed")
    parser.add_argument("--runs", type=int, default=2, help="clean runs per rule (all run at once)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--window", type=int, default=5, help="health.straggler_window_steps")
    args = parser.parse_args()
    client, submitted = submit_runs(args)
    deadline = time.monotonic() + 1800
    while any(not (s := client.job_status(done.job_id)) or not s.state.terminal for _, done in submitted):
        if time.monotonic() > deadline:
            raise SystemExit("bench: runs did not end within 30 min")
        time.sleep(2)
    alarms: dict[str, list[int]] = {rule: [] for rule in RULES}
    for rule, done in submitted:
        state = client.job_status(done.job_id)
        if state is None or not state.state.succeeded:
            raise SystemExit(f"bench: run {done.run_dir} ended {state}; not a clean run")
        events = read_events(RunDir(done.run_dir).events)
        alarms[rule].append(sum(e["kind"] == "straggler" for e in events))
    windows = args.runs * (args.steps // args.window)
    rates = {}
    for rule, counts in alarms.items():
        rates[rule] = sum(1 for c in counts if c) / args.runs
        print(
            f"{rule:<12} false alarms in {sum(1 for c in counts if c)} of {args.runs} clean runs "
            f"({sum(counts)} events, {windows} windows checked)"
        )
    old, new = rates["ratio alone"], rates["default"]
    print(f"ratio new/old false-alarm rate: {new / old:.2f}" if old else "ratio: the old rule raised no alarm either")


if __name__ == "__main__":
    main()
