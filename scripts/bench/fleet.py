#!/usr/bin/env python3
"""Fleet report benchmark: ``air-hpc fleet report`` over a million synthetic sacct lines, against reading the same
lines with the csv module alone, in the same run.

Writes the lines of ``--jobs`` synthetic jobs (``air_hpc.fleet.synthetic``: about ten lines a job, requeues
included) to a file, puts a ``sacct`` that prints it first on PATH, then runs, each as its own process:
``air-hpc fleet report --json`` over a window holding every line (the whole command: the real SlurmClient,
parsing, the report, JSON), and the baseline, ``csv.reader`` over the file counting its rows. Prints the
wall time and peak memory (maxrss) of each and their ratios, with the goal (<10 s, <1 GB). Usage:
``scripts/bench/fleet.py [--jobs 100000] [--seed 1] [--dir DIR]``.
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_S = 10.0
GOAL_BYTES = 1 << 30
BASELINE = """
import csv, sys
rows = 0
with open(sys.argv[1], newline="") as f:
    for row in csv.reader(f, delimiter="|"):
        rows += 1
print(rows)
"""


#: Writes the lines in a process of its own: the benchmark's process stays small, and a child's peak RSS (which
#: Linux keeps across exec) starts from that, not from the generator's.
GENERATE = """
import sys
from air_hpc.fleet.synthetic import sacct_lines
path, jobs, seed, now_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
lines = 0
with open(path, "w") as out:
    for line in sacct_lines(jobs, seed, now_s):
        out.write(line + "\\n")
        lines += 1
print(lines)
"""


def write_lines(path: Path, jobs: int, seed: int, now_s: int) -> int:
    args = [sys.executable, "-c", GENERATE, str(path), str(jobs), str(seed), str(now_s)]
    return int(subprocess.run(args, check=True, capture_output=True, text=True).stdout)


def fake_sacct(bin_dir: Path, lines: Path) -> None:
    script = bin_dir / "sacct"
    script.write_text(f"#!/bin/sh\nexec cat '{lines}'\n")
    script.chmod(0o755)


def measured(args: list[str], env: dict[str, str], out_path: Path) -> tuple[float, int, str]:
    """(wall seconds, peak RSS bytes, stdout) of one process, reaped with wait4 for its own resource usage."""
    started = time.perf_counter()
    with out_path.open("w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.PIPE, env=env, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    if proc.returncode != 0:
        err = proc.stderr.read() if proc.stderr is not None else ""
        raise SystemExit(f"{shlex.join(args)} failed (exit {proc.returncode}): {err.strip()}")
    if proc.stderr is not None:
        proc.stderr.close()
    return wall, usage.ru_maxrss * 1024, out_path.read_text()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dir", type=Path, default=None, help="Where to write the lines (a temporary directory).")
    args = parser.parse_args()
    now_s = int(time.time())
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        lines_path = root / "sacct.txt"
        started = time.perf_counter()
        lines = write_lines(lines_path, args.jobs, args.seed, now_s)
        print(f"generated {lines:,} sacct lines of {args.jobs:,} jobs ({lines_path.stat().st_size / 1e6:.0f} MB) "
              f"in {time.perf_counter() - started:.1f} s")  # fmt: skip
        fake_sacct(root, lines_path)
        env = {**os.environ, "PATH": f"{root}{os.pathsep}{os.environ['PATH']}"}
        env.pop("SLURM_CONF", None)
        base_s, base_rss, base_out = measured([sys.executable, "-c", BASELINE, str(lines_path)], env, root / "base.out")
        command = [sys.executable, "-m", "air_hpc", "fleet", "report", "--json", "--root", str(root / "runs"),
                   "--since", str(now_s - 8 * 86400), "--until", str(now_s + 60)]  # fmt: skip
        ours_s, ours_rss, ours_out = measured(command, env, root / "ours.out")
    report = json.loads(ours_out)
    assert int(base_out) == lines == report["sacct"]["rows"] + report["sacct"]["malformed"]
    print(f"csv.reader alone (baseline)  {base_s:7.2f} s  {base_rss / 1e6:7.0f} MB  ({int(base_out):,} rows)")
    what = (
        f"{report['total']['jobs']:,} jobs, {len(report['tenants'])} tenants, {report['sacct']['malformed']} malformed"
    )
    print(f"air-hpc fleet report --json  {ours_s:7.2f} s  {ours_rss / 1e6:7.0f} MB  ({what})")
    print(f"ratio                        {ours_s / base_s:7.1f}x     {ours_rss / base_rss:5.1f}x")
    verdict = "met" if ours_s < GOAL_S and ours_rss < GOAL_BYTES else "NOT met"
    print(f"goal <{GOAL_S:g} s and <1 GB: {verdict} (on this machine, load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
