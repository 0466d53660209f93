"""Gather a fleet report: ask sacct for the window, find our runs among its jobs, build the report."""

from collections.abc import Iterable, Sequence
from pathlib import Path

from air_hpc.fleet.jobs import Window
from air_hpc.fleet.report import FleetReport, Prices, build_fleet_report
from air_hpc.fleet.runs import RunFacts, index_runs, run_facts
from air_hpc.slurm.client import SlurmClient


def collect(
    client: SlurmClient, window: Window, accounts: Sequence[str], roots: Iterable[Path], prices: Prices
) -> FleetReport:
    """The report of the window: every job sacct knows (of ``accounts``, or all), ours joined with their records."""
    accounting = client.accounting(window.since_s, window.until_s, accounts)
    index = index_runs(roots)
    facts: dict[Path, RunFacts | None] = {}
    runs: dict[str, RunFacts] = {}
    for job_id in {row.job_id for row in accounting.rows} & index.by_job.keys():
        run_dir = index.by_job[job_id]
        if run_dir.path not in facts:
            facts[run_dir.path] = run_facts(run_dir)
        found = facts[run_dir.path]
        if found is not None:
            runs[job_id] = found
    return build_fleet_report(accounting, window, runs, prices, index.runs)
