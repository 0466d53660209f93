"""``air-hpc fleet``: many tenants on one cluster, from Slurm's accounting joined with our runs' records."""

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from air_hpc.cli.options import echo_json, json_option, slurm_client


@click.group()
def fleet() -> None:
    """Per-tenant usage, waits, preemptions, failures, goodput and cost, for a platform team."""


def _window_options(func: Callable[..., Any]) -> Callable[..., Any]:
    func = click.option(
        "--until", default=None, help="End of the window [default: now]; a time, epoch seconds, or a span ago."
    )(func)
    func = click.option(
        "--since",
        default=None,
        help="Start of the window [default: 1d, a day ago]: 2026-12-01, 2026-12-01T08:00, 36h, 7d, 2w, epoch seconds.",
    )(func)
    return func


@fleet.command()
@_window_options
@click.option("--account", "accounts", multiple=True, help="Only this tenant (Slurm account); repeatable.")
@click.option(
    "--root",
    "roots",
    multiple=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory holding our run directories, joined by job id (repeatable) [default: $AIR_HPC_RUNS_ROOT, "
    "else ./runs].",
)
@click.option("--cluster", default=None, help="Cluster profile (name or YAML file) with usd_per_node_hour/_gpu_hour.")
@click.option("--hardware", default=None, help="Hardware preset (name or YAML file) whose prices apply otherwise.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), help="Also write this PNG.")
@json_option
def report(
    since: str | None,
    until: str | None,
    accounts: tuple[str, ...],
    roots: tuple[Path, ...],
    cluster: str | None,
    hardware: str | None,
    plot_path: Path | None,
    as_json: bool,
) -> None:
    """Per tenant and QOS: jobs, node- and GPU-hours, queue waits, preemptions, requeues, failures by kind,
    goodput (scheduling x runtime x program) with badput by cause, and cost, over a window of sacct's records."""
    from air_hpc.errors import UserError
    from air_hpc.fleet.collect import collect
    from air_hpc.fleet.prices import prices_of
    from air_hpc.fleet.render import report_json, report_view
    from air_hpc.fleet.window import parse_window
    from air_hpc.ops.runs import runs_root

    if plot_path is not None and plot_path.suffix.lower() != ".png":
        raise UserError(f"--plot {plot_path}: expected a .png file name")
    window = parse_window(since, until, time.time())
    prices = prices_of(cluster, hardware)
    result = collect(slurm_client(), window, accounts, roots or (runs_root(),), prices)
    if plot_path is not None and not result.empty:
        from air_hpc.fleet.plot import plot_fleet

        plot_fleet(result, plot_path)
    priced = prices.usd_per_node_hour is not None or prices.usd_per_gpu_hour is not None
    if as_json:
        echo_json(report_json(result))
        return
    from rich.console import Console

    console = Console()
    (console if console.is_terminal else Console(width=200)).print(report_view(result, priced))
    if plot_path is not None:
        click.echo(f"plot: {plot_path}" if not result.empty else f"plot: none written to {plot_path} (no jobs)")
