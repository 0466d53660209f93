"""``air-hpc render | submit | status | logs | cancel``: launch, watch and stop a run."""

import getpass
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from air_hpc.cli.options import job_argument, json_option, set_option
from air_hpc.errors import UserError

if TYPE_CHECKING:
    from air_hpc.slurm.client import SlurmClient

python_option = click.option(
    "--python",
    metavar="PATH",
    help="Python interpreter on the compute nodes (default: cluster.python, else the one running air-hpc).",
)


def _client() -> "SlurmClient":
    """The Slurm client: injected through the click context object in tests, else a real one."""
    from air_hpc.slurm.client import SlurmClient

    obj = click.get_current_context().obj
    injected = obj.get("slurm_client") if isinstance(obj, dict) else None
    return injected if isinstance(injected, SlurmClient) else SlurmClient(retries=2, backoff_s=1.0)


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True))


@click.command()
@job_argument
@set_option
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the script here instead of stdout.")
@python_option
def render(job_file: str, overrides: tuple[str, ...], output: str | None, python: str | None) -> None:
    """Print the batch script for JOB_FILE. Contacts no Slurm daemon: every node counts as free."""
    from air_hpc.config import load_job
    from air_hpc.launch.submit import plan

    job = load_job(job_file, overrides)
    script = plan(job, None, python=python).script
    if output:
        Path(output).write_text(script)
    else:
        click.echo(script, nl=False)


@click.command()
@job_argument
@set_option
@click.option(
    "--executor",
    type=click.Choice(["slurm", "submitit", "local"]),
    default="slurm",
    show_default=True,
    help="slurm: our script via sbatch; submitit: submitit's SlurmExecutor; local: this machine.",
)
@click.option("--dry-run", is_flag=True, help="Validate and render (and sbatch --test-only); submit nothing.")
@click.option("--wait", is_flag=True, help="Follow the job to its end and print a summary.")
@python_option
@json_option
def submit(
    job_file: str,
    overrides: tuple[str, ...],
    executor: str,
    dry_run: bool,
    wait: bool,
    python: str | None,
    as_json: bool,
) -> None:
    """Validate, record and submit JOB_FILE; print the job id."""
    from air_hpc.config import load_job
    from air_hpc.launch import submit as submitting

    job = load_job(job_file, overrides)
    client = _client()
    if dry_run:
        submitting.check_data(job)
        planned = submitting.plan(job, None if executor == "local" else client, python=python, test_only=True)
        _report_dry_run(planned, as_json)
        return
    done = submitting.submit(job, executor, client, python=python)  # type: ignore[arg-type]
    if not wait:
        if as_json:
            _echo_json(done.to_json())
        else:
            for note in done.plan.notes:
                click.echo(f"note: {note}", err=True)
            click.echo(done.job_id)
        return
    _wait_and_summarize(done, client, as_json)


def _report_dry_run(planned: Any, as_json: bool) -> None:
    test_only = planned.test_only
    if as_json:
        _echo_json(
            {
                "run_dir": str(planned.spec.run_dir),
                "nodelist": planned.request.nodelist,
                "switches": planned.request.switches,
                "notes": list(planned.notes),
                "test_only": None if test_only is None else {"start": test_only.start, "nodelist": test_only.nodelist},
                "script": planned.script,
            }
        )
        return
    click.echo(planned.script, nl=False)
    for note in planned.notes:
        click.echo(f"note: {note}", err=True)
    if test_only is not None:
        click.echo(f"dry run: sbatch --test-only: would start {test_only.start} on {test_only.nodelist}", err=True)
    click.echo(f"dry run: nothing submitted; run dir would be {planned.spec.run_dir}", err=True)


def _wait_and_summarize(done: Any, client: Any, as_json: bool) -> None:
    from air_hpc.launch.control import run_status
    from air_hpc.launch.submit import TrainingFailed, describe_failure, wait_local, wait_slurm
    from air_hpc.rundir import RunDir

    if not as_json:
        click.echo(f"submitted job {done.job_id} ({done.executor}); run dir {done.run_dir}")
    if done.executor == "local":
        wait_local(done)
    else:

        def show(status: Any) -> None:
            if not as_json:
                click.echo(f"job {status.job_id}: {status.state} (restarts {status.restarts})")

        wait_slurm(client, done.job_id, on_change=show)
    status = run_status(RunDir(done.run_dir), client)
    if as_json:
        _echo_json(status.to_json())
    else:
        click.echo(_summary(status))
        if status.progress is not None:
            click.echo(f"progress {status.progress.describe()}")
    if not status.job.state.succeeded:
        raise TrainingFailed(describe_failure(status.job))


def _summary(status: Any) -> str:
    lines = [
        f"run      {status.run_dir.path}",
        f"job      {status.job.job_id} ({status.submission.executor}): {status.job.state}"
        + (f" ({status.job.reason})" if status.job.reason else ""),
    ]
    if status.job.nodelist:
        lines.append(f"nodes    {status.job.nodelist} ({status.job.nodes})")
    if status.job.elapsed:
        lines.append(f"elapsed  {status.job.elapsed}")
    lines.append(f"restarts {status.restarts}")
    if status.job.exit_code is not None:
        lines.append(f"exit     {status.job.exit_code}")
    if status.bad_nodes:
        lines.append(f"bad      {','.join(status.bad_nodes)}")
    return "\n".join(lines)


@click.command()
@click.argument("target", required=False, metavar="[RUN_OR_JOB]")
@json_option
def status(target: str | None, as_json: bool) -> None:
    """State of a run (its directory) or a Slurm job id; without one, your queued jobs."""
    from air_hpc.launch.control import run_status
    from air_hpc.launch.runs import resolve_run

    client = _client()
    if target is None:
        records = client.squeue(user=getpass.getuser())
        if as_json:
            _echo_json(
                [{"job_id": r.job_id, "state": str(r.state), "nodelist": r.nodelist, "name": r.name} for r in records]
            )
        else:
            for r in records:
                click.echo(f"{r.job_id:>8}  {r.state!s:<11} {r.nodes:>3}  {r.nodelist or r.reason:<16} {r.name}")
        return
    if target.isdigit() and not Path(target).exists():
        job = client.job_status(target)
        if job is None:
            raise UserError(f"job {target}: neither squeue nor sacct knows it")
        if as_json:
            _echo_json(job.to_json())
        else:
            click.echo(
                f"job {job.job_id} ({job.name}): {job.state}, {job.nodes} node(s) {job.nodelist}, "
                f"restarts {job.restarts}"
            )
        return
    result = run_status(resolve_run(target), client)
    if as_json:
        _echo_json(result.to_json())
        return
    click.echo(_summary(result))
    if result.progress is not None:
        from rich.console import Console

        from air_hpc.observe.progress import progress_view

        Console().print(progress_view(result.progress))


@click.command()
@click.argument("run")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output until the job ends.")
@click.option("--rank", type=click.IntRange(min=0), help="Only this rank's output.")
def logs(run: str, follow: bool, rank: int | None) -> None:
    """Print a run's output (the batch log, or one rank's)."""
    from air_hpc.launch.control import log_files, rank_filter, run_status
    from air_hpc.launch.runs import latest_submission, resolve_run

    run_dir = resolve_run(run)
    record = latest_submission(run_dir)
    files = log_files(run_dir, record, rank)
    prefix = rank_filter(record, rank)
    offsets = dict.fromkeys(files, 0)
    several = len(files) > 1 and prefix is None
    shown_last: list[Path | None] = [None]

    def drain(whole: bool) -> bool:
        """Print what was appended; while following, hold back a line still being written."""
        printed = False
        for path in files:
            try:
                with path.open("rb") as handle:
                    handle.seek(offsets[path])
                    data = handle.read()
            except FileNotFoundError:
                continue
            complete = data if whole else data[: data.rfind(b"\n") + 1]
            offsets[path] += len(complete)
            lines = complete.decode(errors="replace").splitlines()
            if prefix is not None:
                lines = [line for line in lines if line.lstrip().startswith(prefix)]
            if lines and several and shown_last[0] != path:
                click.echo(f"==> {path.name} <==")
                shown_last[0] = path
            for line in lines:
                click.echo(line)
            printed = printed or bool(lines)
        return printed

    drain(whole=not follow)
    if not any(path.exists() for path in files) and not follow:
        raise UserError(f"{run}: no output yet for job {record.job_id} (looked for {', '.join(p.name for p in files)})")
    if not follow:
        return
    client = _client()
    while True:
        time.sleep(1.0)
        drain(whole=False)
        if run_status(run_dir, client).job.state.terminal:
            time.sleep(1.0)
            drain(whole=True)
            return


@click.command()
@click.argument("run")
def cancel(run: str) -> None:
    """Cancel a run's current job."""
    from air_hpc.launch.control import cancel_run
    from air_hpc.launch.runs import resolve_run

    record = cancel_run(resolve_run(run), _client())
    click.echo(f"cancelled job {record.job_id} ({record.executor})")
