#!/usr/bin/env python3
"""Heartbeat benchmark: what a beat per step costs, against the metrics line the trainer already writes.

Prints the time per call of ``Heartbeat.beat`` (every beat written to its file, and throttled as
``rank_guard`` sets it up) next to ``MetricsWriter.write`` of one step's record (baseline, measured
in the same run on the same file system), as ratios. Usage:
``scripts/bench/heartbeat.py [--dir DIR] [--calls 5000] [--interval-s 1.5]``.
"""

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from air_hpc.health.heartbeat import Heartbeat
from air_hpc.train.metrics import MetricsWriter, StepMetrics


def per_call_us(call: Callable[[int], None], calls: int, repeats: int = 5) -> float:
    """Median over ``repeats`` of the mean time per call, in microseconds."""
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        for i in range(calls):
            call(i)
        samples.append((time.perf_counter() - started) / calls * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", type=Path, default=None, help="Directory on the file system to measure.")
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--interval-s", type=float, default=1.5, help="Throttle interval of the file.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        writer = MetricsWriter(root / "metrics.jsonl")
        record = StepMetrics(step=1, loss=2.5, lr=1e-4, grad_norm=1.0, tokens_per_s=1e5, step_time_s=0.5)
        baseline = per_call_us(lambda i: writer.write(record), args.calls)
        writer.close()
        every = Heartbeat(root / "every", 0, "n1")
        every_us = per_call_us(lambda i: every.beat("step", i), args.calls)
        throttled = Heartbeat(root / "throttled", 0, "n1", file_interval_s=args.interval_s)
        throttled_us = per_call_us(lambda i: throttled.beat("step", i), args.calls)
    print(f"metrics line (baseline)      {baseline:8.1f} us/step")
    print(f"beat, file every step        {every_us:8.1f} us/step  {every_us / baseline:6.2f}x baseline")
    print(
        f"beat, file every {args.interval_s:g} s (used) {throttled_us:8.1f} us/step  "
        f"{throttled_us / baseline:6.2f}x baseline"
    )


if __name__ == "__main__":
    main()
