"""``air-hpc sweep``: many runs of one job file from one command, as one Slurm job array."""

import dataclasses
from typing import TYPE_CHECKING

import click

from air_hpc.cli.options import echo_json, job_argument, json_option, set_option, slurm_client

if TYPE_CHECKING:
    from air_hpc.launch.route import RouteDecision
    from air_hpc.launch.sweep import Element, SweepSubmission
    from air_hpc.ops.sweeps import ElementRow
    from air_hpc.slurm.client import SlurmClient


@click.command()
@job_argument
@set_option
@click.option("--grid", "grid", multiple=True, metavar="KEY=V1,V2", help="Sweep KEY over these values (repeatable).")
@click.option(
    "--random",
    "draws",
    multiple=True,
    metavar="KEY=DIST",
    help="Draw KEY from uniform:LO:HI, loguniform:LO:HI, int:LO:HI or choice:A|B (repeatable; with --count).",
)
@click.option("--count", type=int, help="Random draws per grid point.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random draws.")
@click.option("--max-parallel", type=click.IntRange(min=1), help="Elements running at once (the array's %K).")
@click.option(
    "--executor",
    type=click.Choice(["slurm", "local"]),
    default="slurm",
    show_default=True,
    help="slurm: one job array via sbatch; local: one local job per element on this machine.",
)
@click.option("--force", is_flag=True, help="Submit complete elements too (their final checkpoint exists).")
@click.option("--dry-run", is_flag=True, help="Check every element and list them; submit nothing.")
@click.option("--wait", is_flag=True, help="Follow every element to its end; exit non-zero if one failed.")
@click.option("--python", metavar="PATH", help="Python interpreter on the compute nodes.")
@click.option(
    "--clusters",
    metavar="A,B",
    help="Ask these Slurm clusters when and on which nodes the first element to submit would start, and submit "
    "the whole array where it starts soonest at acceptable topology quality (as submit --clusters).",
)
@json_option
def sweep(
    job_file: str,
    overrides: tuple[str, ...],
    grid: tuple[str, ...],
    draws: tuple[str, ...],
    count: int | None,
    seed: int,
    max_parallel: int | None,
    executor: str,
    force: bool,
    dry_run: bool,
    wait: bool,
    python: str | None,
    clusters: str | None,
    as_json: bool,
) -> None:
    """Submit JOB_FILE once per setting of the swept keys, as ONE job array (``--array=0-M%K``).

    Element i is the run ``<run.name>-i`` with its settings in its job.json; Slurm preempts,
    requeues and resumes each on its own. ``air-hpc runs --sweep NAME`` lists them best first;
    ``status``, ``cancel`` (``NAME`` or ``NAME/i``) and ``report`` take the sweep's name.
    """
    from air_hpc.launch.grid import expand, parse_grid, parse_random
    from air_hpc.launch.sweep import load_elements, pending_elements, submit_sweep

    settings = expand(parse_grid(grid), parse_random(draws), count, seed)
    name, elements = load_elements(job_file, overrides, settings)
    if dry_run:
        todo, notes = pending_elements(elements, force)
        for note in notes:
            click.echo(f"note: {note}", err=True)
        for element in todo:
            click.echo(f"{element.job.run.dir}  " + " ".join(f"{k}={v}" for k, v in element.settings))
        click.echo(f"dry run: sweep {name}, {len(todo)} of {len(elements)} elements; nothing submitted", err=True)
        return
    client = slurm_client()
    decision = None
    if clusters is not None:
        elements, client, decision = _route(elements, client, clusters, executor, python, force, as_json)
    done = submit_sweep(
        name,
        elements,
        executor,  # type: ignore[arg-type]
        client,
        max_parallel=max_parallel,
        python=python,
        force=force,
        route=decision,
    )
    _say_submitted(done, as_json and not wait)
    if wait:
        _wait(done, as_json)


def _route(
    elements: "list[Element]",
    client: "SlurmClient",
    clusters: str,
    executor: str,
    python: str | None,
    force: bool,
    as_json: bool,
) -> "tuple[list[Element], SlurmClient, RouteDecision]":
    """``--clusters``: one cluster for the whole array (its tasks share one request), chosen by asking each where
    the first element still to run would start (:mod:`air_hpc.launch.route`); every element aimed at it."""
    from air_hpc.launch.route import check_routable, planned_start, route_job
    from air_hpc.launch.sweep import pending_elements

    check_routable(executor, "sweep")
    todo, _ = pending_elements(elements, force)
    routed = route_job(
        (todo or elements)[0].job,
        clusters.split(","),
        client,
        planned_start(python),
        lambda line: click.echo(f"warning: {line}", err=True),
    )
    if not as_json:
        click.echo(f"route: {routed.decision.reason}", err=True)
    return [dataclasses.replace(e, job=routed.aim(e.job)) for e in elements], routed.client, routed.decision


def _say_submitted(done: "SweepSubmission", as_json: bool) -> None:
    if as_json:
        echo_json(done.to_json())
        return
    for note in done.notes:
        click.echo(f"note: {note}", err=True)
    record = done.record
    what = f"array job {done.job_id}" if done.job_id else f"{len(done.submitted)} local job(s)"
    if not done.submitted:
        what = "nothing (every element is complete)"
    if done.route is not None and done.job_id:
        what += f" on cluster {done.route.cluster}"
    click.echo(f"sweep {record.name}: {len(done.submitted)} of {len(record.elements)} element(s) as {what}", err=True)
    for element in record.elements:
        click.echo(f"  {element.index}  {element.run_dir}  {element.describe()}", err=True)
    if done.job_id:
        click.echo(done.job_id)


def _wait(done: "SweepSubmission", as_json: bool) -> None:
    from air_hpc.errors import TrainingFailed
    from air_hpc.ops.sweeps import sweep_rows, wait_sweep
    from air_hpc.ops.waiting import wait_deadline_s
    from air_hpc.records.rundir import RunDir

    client = slurm_client()
    record = done.record
    jobs = [RunDir(e.run_dir).read_job() for e in record.elements]
    per_element_s = max(wait_deadline_s(job) for job in jobs)
    waves = -(-len(record.elements) // (record.max_parallel or len(record.elements)))
    say = (lambda _: None) if as_json else (lambda line: click.echo(line, err=True))
    final = wait_sweep(record, client, timeout_s=per_element_s * waves, say=say)
    rows = sweep_rows(record, client)
    if as_json:
        echo_json({**done.to_json(), "elements": [r.to_json() for r in rows]})
    else:
        print_rows(rows)
    failed = sorted(i for i, state in final.items() if state != "COMPLETED")
    if failed:
        raise TrainingFailed(f"sweep {record.name}: element(s) {', '.join(map(str, failed))} did not complete")


def print_rows(rows: "list[ElementRow]") -> None:
    """The sweep's table, best first: index, settings, state, step, loss, restarts, goodput, job."""
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for column in ("#", "settings", "state", "step", "loss", "restarts", "goodput", "job"):
        table.add_column(column, justify="right" if column in ("#", "step", "loss", "restarts", "goodput") else "left")
    for item in rows:
        s = item.row.summary
        step = "-" if s.step is None else f"{s.step}" + (f"/{s.total_steps}" if s.total_steps else "")
        table.add_row(
            str(item.element.index),
            item.element.describe() or "-",
            item.row.state,
            step,
            "-" if s.loss is None else f"{s.loss:.4f}",
            str(s.restarts),
            "-" if s.goodput is None else f"{100 * s.goodput:.1f}%",
            item.row.job_id or "-",
        )
    console = Console()
    (console if console.is_terminal else Console(width=250)).print(table)
