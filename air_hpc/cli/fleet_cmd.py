"""``air-hpc fleet``: many tenants on one cluster, from Slurm's accounting joined with our runs' records."""

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from air_hpc.cli.options import echo_json, json_option, serve_metrics, slurm_client, state_dir_option

if TYPE_CHECKING:
    from air_hpc.fleet.report import FleetReport
    from air_hpc.fleet.slo import Attainment
    from air_hpc.slurm.client import SlurmClient

log = logging.getLogger(__name__)


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
@click.option(
    "--slo",
    "slo_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Targets per tenant or QOS (configs/slo.yaml): attainment, error budget left, worst jobs; exit 1 if one "
    "is missed.",
)
@json_option
@click.pass_context
def report(
    ctx: click.Context,
    since: str | None,
    until: str | None,
    accounts: tuple[str, ...],
    roots: tuple[Path, ...],
    cluster: str | None,
    hardware: str | None,
    plot_path: Path | None,
    slo_path: Path | None,
    as_json: bool,
) -> None:
    """Per tenant and QOS: jobs, node- and GPU-hours, queue waits, preemptions, requeues, failures by kind,
    goodput (scheduling x runtime x program) with badput by cause, and cost, over a window of sacct's records."""
    from air_hpc.errors import UserError
    from air_hpc.fleet.render import report_json, report_view, slo_json, slo_view
    from air_hpc.fleet.slo import all_met

    if plot_path is not None and plot_path.suffix.lower() != ".png":
        raise UserError(f"--plot {plot_path}: expected a .png file name")
    client = slurm_client()
    result, slo = _report_and_slo(client, since, until, accounts, roots, cluster, hardware, slo_path)
    if plot_path is not None and not result.empty:
        from air_hpc.fleet.plot import plot_fleet

        plot_fleet(result, plot_path)
    if as_json:
        echo_json(report_json(result, slo_json(slo, result)))
    else:
        from rich.console import Console

        console = Console()
        out = console if console.is_terminal else Console(width=200)
        out.print(report_view(result, result.priced))
        if slo_path is not None:
            out.print(slo_view(slo, result))
        if plot_path is not None:
            click.echo(f"plot: {plot_path}" if not result.empty else f"plot: none written to {plot_path} (no jobs)")
    if not all_met(slo):
        ctx.exit(1)


def _report_and_slo(
    client: "SlurmClient",
    since: str | None,
    until: str | None,
    accounts: Sequence[str],
    roots: Sequence[Path],
    cluster: str | None,
    hardware: str | None,
    slo_path: Path | None,
) -> tuple["FleetReport", list["Attainment"]]:
    """The window's report and, with an SLO file (read first, so a typo costs no sacct call), its attainment."""
    from air_hpc.errors import SlurmError
    from air_hpc.fleet.collect import collect
    from air_hpc.fleet.prices import prices_of
    from air_hpc.fleet.slo import check_names, evaluate, load_slo
    from air_hpc.fleet.window import parse_window
    from air_hpc.ops.runs import runs_root

    slo = load_slo(slo_path) if slo_path is not None else None
    window = parse_window(since, until, time.time())
    result = collect(client, window, accounts, roots or (runs_root(),), prices_of(cluster, hardware))
    if slo is None:
        return result, []
    try:
        tenants, qos = client.account_names(), client.qos_names()
    except SlurmError as exc:  # sacct answered, so this is rare: judge by the names the window holds
        log.warning("cannot list Slurm's accounts and QOS (%s); checking the SLO file against the window's", exc)
        tenants, qos = tuple(t.key for t in result.tenants), tuple(q.key for q in result.qos)
    check_names(slo, tenants, qos)
    return result, evaluate(slo, result)


@fleet.command()
@click.option("--since", default=None, help="Trailing window of every scrape [default: 1d]: 36h, 7d, 2w, ...")
@click.option("--account", "accounts", multiple=True, help="Only this tenant (Slurm account); repeatable.")
@click.option(
    "--root", "roots", multiple=True, type=click.Path(file_okay=False, path_type=Path),
    help="Directory holding our run directories (repeatable) [default: $AIR_HPC_RUNS_ROOT, else ./runs].",
)  # fmt: skip
@click.option("--cluster", default=None, help="Cluster profile (name or YAML file) with prices.")
@click.option("--hardware", default=None, help="Hardware preset (name or YAML file) whose prices apply otherwise.")
@click.option("--slo", "slo_path", type=click.Path(dir_okay=False, path_type=Path), help="Also export attainment.")
@click.option(
    "--textfile",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the gauges to this *.prom file (atomically) for node_exporter's textfile collector, then exit.",
)
@click.option("--serve", "port", type=click.IntRange(0, 65535), help="Serve /metrics on 127.0.0.1:PORT until Ctrl-C.")
def metrics(
    since: str | None,
    accounts: tuple[str, ...],
    roots: tuple[Path, ...],
    cluster: str | None,
    hardware: str | None,
    slo_path: Path | None,
    textfile: Path | None,
    port: int | None,
) -> None:
    """Per-tenant and per-QOS gauges of the fleet report (trailing window) in Prometheus's text format; served on
    loopback only (put a proxy with authentication in front to reach it from elsewhere)."""
    from air_hpc.errors import UserError
    from air_hpc.fleet.prometheus import families, registry_of
    from air_hpc.observe.prometheus import write_textfile

    if (textfile is None) == (port is None):
        raise UserError("give one of --textfile OUT.prom or --serve PORT")
    if textfile is not None and textfile.suffix != ".prom":
        raise UserError(f"--textfile {textfile}: node_exporter's textfile collector reads only *.prom files")
    client = slurm_client()

    def build() -> tuple["FleetReport", list["Attainment"]]:
        return _report_and_slo(client, since, None, accounts, roots, cluster, hardware, slo_path)

    if textfile is not None:
        report, slo = build()  # a missing sacct or a bad SLO file fails here, in one line, not in the file
        write_textfile(textfile, registry_of(lambda: (report, slo)))
        click.echo(f"wrote {textfile} ({len(families(report, slo))} metric families)")
        return
    assert port is not None  # exactly one of the two, checked above
    build()  # the same checks before serving
    serve_metrics(registry_of(build), port, "127.0.0.1")


def _say(line: str) -> None:
    """A progress line on stderr (stdout keeps the summary, or the JSON)."""
    click.echo(f"simulate: {line}", err=True)


def _tenants_testbed(state_dir: Path) -> tuple[Any, dict[str, Any]]:
    """The testbed at ``state_dir``, brought up with tenants if it is down; one running without them is refused."""
    from air_hpc.errors import UserError
    from air_hpc.testbed import Testbed
    from air_hpc.testbed.conf import Settings

    bed = Testbed(state_dir)
    info = bed.status()
    if not info["up"]:
        _say(f"bringing up a tenants testbed in {bed.layout.root}")
        return bed, bed.up(settings=Settings(tenants=True, preempt_by="qos"))
    settings = info["settings"]
    if not settings.get("tenants") or settings.get("preempt_by") != "qos":
        raise UserError(
            f"testbed in {bed.layout.root} runs without tenants and QOS preemption; `air-hpc testbed down "
            f"--state-dir {bed.layout.root}` then `air-hpc testbed up --tenants --state-dir {bed.layout.root}`"
        )
    return bed, info


@fleet.command()
@click.option("--jobs", "job_count", type=int, required=True, help="Jobs in the workload (at least 6).")
@click.option("--seed", type=int, default=1, show_default=True, help="Seed of the workload's mix and timing.")
@state_dir_option
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("ground_truth.json"),
    show_default=True,
    help="Where the ground truth goes: every job's account, QOS, submit/start/end, preemptions, failures injected.",
)
@click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("runs/fleet-sim"),
    show_default=True,
    help="Directory for the trainings' run directories (and their corpus).",
)
@click.option("--timeout-s", type=click.FloatRange(min=1), default=1800, show_default=True, help="Give up after.")
@json_option
def simulate(
    job_count: int, seed: int, state_dir: Path, out: Path, root: Path, timeout_s: float, as_json: bool
) -> None:
    """Run a seeded mixed workload on the testbed and wait for it; write its ground truth.

    gpt-tiny trainings of three tenants at different QOS, `high` jobs that preempt the `scavenger` ones
    (which save, requeue and resume), short jobs of other users, and injected failures. Exit 1 when
    something did not happen as planned (the ground truth says what, per job).
    """
    from air_hpc.cli.chaos_cmd import sigterm_interrupts
    from air_hpc.errors import UserError
    from air_hpc.fleet.simulate import check_plan_fits, plan_workload, simulate, write_truth
    from air_hpc.testbed.cluster import CLUSTER_NAME

    planned = plan_workload(job_count, seed)  # bad input fails before the testbed starts
    if out.parent and not out.parent.is_dir():
        raise UserError(f"--out {out}: no directory {out.parent}")
    bed, info = _tenants_testbed(state_dir)
    check_plan_fits(planned, len(info["nodes"]))
    with sigterm_interrupts():
        truth = simulate(job_count, seed, bed.client(), root, len(info["nodes"]), CLUSTER_NAME, timeout_s, _say)
    write_truth(truth, out)
    if as_json:
        echo_json(truth)
    else:
        for job in truth["jobs"]:
            mark = "ok" if job["ok"] else f"expected {job['expected']}, saw {job['observed']}"
            click.echo(
                f"{job['job_id']:>8}  {job['account']:<9} {job['qos']:<9} {job['kind']:<10} {job['name']}  {mark}"
            )
        click.echo(f"ground truth: {out}")
    if not truth["ok"]:
        click.get_current_context().exit(1)
