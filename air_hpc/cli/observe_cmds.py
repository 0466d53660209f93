"""``air-hpc plot | report``: what a run did, from its files (works after the job left the queue)."""

import time
from typing import TYPE_CHECKING

import click

from air_hpc.cli.options import echo_json, json_option
from air_hpc.errors import UserError

if TYPE_CHECKING:
    from air_hpc.observe.records import RunRecords
    from air_hpc.observe.report import RunReport
    from air_hpc.records.rundir import RunDir


def _records(run: str) -> tuple["RunDir", "RunRecords", "RunReport"]:
    from air_hpc.observe.records import load_records
    from air_hpc.observe.report import build_report
    from air_hpc.ops.runs import resolve_run
    from air_hpc.records import names

    run_dir = resolve_run(run)
    records = load_records(run_dir)
    report = build_report(records)
    if report is None:
        raise UserError(f"{run}: the run has not started yet (no steps in {names.METRICS}, no start recorded)")
    return run_dir, records, report


@click.command()
@click.argument("run")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="PNG file to write.")
def plot(run: str, output: str) -> None:
    """Plot loss, throughput and the timeline of preemptions, checkpoints and restarts of RUN."""
    from pathlib import Path

    from air_hpc.observe.plot import plot_run

    if not output.lower().endswith(".png"):
        raise UserError(f"-o {output}: expected a .png file name")
    run_dir, records, report = _records(run)
    written = plot_run(records, report, Path(output), run_dir.path.name)
    click.echo(f"wrote {written}")


@click.command()
@click.argument("run")
@json_option
def report(run: str, as_json: bool) -> None:
    """Goodput of RUN, what each restart cost, and the checkpoint overhead; a sweep's name: each element's."""
    from air_hpc.observe.progress import run_progress
    from air_hpc.observe.report import format_report
    from air_hpc.ops.sweeps import find_sweep

    record = find_sweep(run)
    if record is not None:
        _sweep_report([str(e.run_dir) for e in record.elements], as_json)
        return
    _, records, built = _records(run)
    if as_json:
        progress = run_progress(records, time.time())
        data = {**built.to_json(), "progress": progress.to_json() if progress else None}
        echo_json(data)
    else:
        click.echo(format_report(built))


def _sweep_report(run_dirs: list[str], as_json: bool) -> None:
    """Each element's report in turn; an element that has not started yet is said so, not fatal to the rest."""
    from air_hpc.observe.report import format_report

    reports: list[dict[str, object]] = []
    for run_dir in run_dirs:
        try:
            _, _, built = _records(run_dir)
        except UserError as exc:
            reports.append({"run_dir": run_dir, "error": str(exc)})
            if not as_json:
                click.echo(f"==> {run_dir} <==\n{exc}\n")
            continue
        reports.append({"run_dir": run_dir, **built.to_json()})
        if not as_json:
            click.echo(f"==> {run_dir} <==\n{format_report(built)}\n")
    if as_json:
        echo_json(reports)
