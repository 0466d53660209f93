"""``air-hpc render | submit | status | logs | cancel``: launch, watch and stop a run."""

import getpass
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from air_hpc.cli.options import echo_json, job_argument, json_option, run_argument, set_option, slurm_client
from air_hpc.digits import ascii_int
from air_hpc.errors import UserError
from air_hpc.slurm.reasons import plain_reason, with_reason

if TYPE_CHECKING:
    from air_hpc.config.models import JobConfig
    from air_hpc.launch.plan import Plan
    from air_hpc.launch.route import RouteDecision
    from air_hpc.launch.submit import Submission
    from air_hpc.ops.control import LogSource, RunStatus
    from air_hpc.records.rundir import RunDir
    from air_hpc.records.sweeps import SweepRecord
    from air_hpc.slurm.client import SlurmClient

python_option = click.option(
    "--python",
    metavar="PATH",
    help="Python interpreter on the compute nodes (default: cluster.python, else the one running air-hpc).",
)


@click.command()
@job_argument
@set_option
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the script here instead of stdout.")
@python_option
def render(job_file: str, overrides: tuple[str, ...], output: str | None, python: str | None) -> None:
    """Print the batch script for JOB_FILE (a file or a preset job's name). Contacts no Slurm daemon: every node
    counts as free. The run directory it would use goes to stderr."""
    from air_hpc.config import load_job
    from air_hpc.launch.plan import plan

    job = load_job(job_file, overrides)
    script = plan(job, None, python=python).script
    if output:
        Path(output).write_text(script)
    else:
        click.echo(script, nl=False)
    click.echo(f"run dir {job.run.dir}", err=True)


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
@click.option("--force", is_flag=True, help="Submit even when the run's final checkpoint exists (the run is complete).")
@click.option(
    "--fresh",
    is_flag=True,
    help="Start the run from step 0: move its existing run directory aside (RUN.replaced-TIME, nothing deleted).",
)
@click.option(
    "--after",
    metavar="RUN_OR_JOB[:ok|any|notok]",
    help="Start only after that job (a run or sweep: its current job) ends: ok (default), any, notok.",
)
@click.option(
    "--chain",
    type=int,
    default=1,
    show_default=True,
    help="Submit N links of the run, one at a time (--dependency=singleton), each resuming where the last stopped.",
)
@click.option(
    "--clusters",
    metavar="A,B",
    help="Ask these Slurm clusters (the profile's cluster.clusters, else those slurmdbd knows) when and on which "
    "nodes the job would start, and submit where it starts soonest at acceptable topology quality.",
)
@python_option
@json_option
def submit(
    job_file: str,
    overrides: tuple[str, ...],
    executor: str,
    dry_run: bool,
    wait: bool,
    force: bool,
    fresh: bool,
    after: str | None,
    chain: int,
    clusters: str | None,
    python: str | None,
    as_json: bool,
) -> None:
    """Validate, record and submit JOB_FILE; print the job id (with --chain, one per link).

    With --clusters, each cluster is asked first and the choice and its reason go to stderr and to the
    run's events (``route``); a cluster that does not answer is skipped with a warning, none answering exits 2.

    A run directory holding checkpoints of another model (shapes, vocabulary, tokenizer) is refused
    (exit 2): give a new run.name or --fresh. A changed parallel layout or node count resumes.
    """
    from air_hpc.config import load_job
    from air_hpc.launch import submit as submitting
    from air_hpc.launch.chain import dependency

    job = load_job(job_file, overrides)
    client = slurm_client()
    waits = _waits_for(job, client, executor, after, chain)
    _note_resume(job, fresh, as_json)
    decision = None
    if clusters is not None:
        job, client, decision = _route(job, client, clusters, executor, python, waits, chain, as_json)
    if dry_run:
        _dry_run(job, client, executor, python, dependency(waits, chain), fresh, as_json)
        return
    try:
        done = submitting.submit(
            job,
            executor,  # type: ignore[arg-type]
            client,
            python=python,
            force=force,
            fresh=fresh,
            after=waits,
            chain=chain,
            route=decision,
        )
    except submitting.RunComplete as complete:  # nothing to do is not an error: say so, exit 0
        if as_json:
            echo_json({"complete": True, "run_dir": str(job.run.dir), "message": str(complete)})
        else:
            click.echo(str(complete), err=True)
        return
    _report_submitted(done, client, wait, as_json)


def _note_resume(job: "JobConfig", fresh: bool, as_json: bool) -> None:
    """What the run resumes from, unless it is refused (another model's checkpoints: exit 2)."""
    from air_hpc.launch.resume import check_resume

    resume = check_resume(job, fresh)
    note = None if resume is None else resume.note()
    if note is not None and not as_json:
        click.echo(f"note: {note}", err=True)


def _report_submitted(done: "Submission", client: "SlurmClient", wait: bool, as_json: bool) -> None:
    if done.set_aside is not None and not as_json:
        click.echo(f"moved the previous run directory aside to {done.set_aside}", err=True)
    if wait:
        _wait_and_summarize(done, client, as_json)
    elif as_json:
        echo_json(done.to_json())
    else:
        _say_submitted(done)


def _route(
    job: "JobConfig",
    client: "SlurmClient",
    clusters: str,
    executor: str,
    python: str | None,
    waits: str | None,
    chain: int,
    as_json: bool,
) -> "tuple[JobConfig, SlurmClient, RouteDecision]":
    """``--clusters``: the job and client aimed at the cluster chosen (:mod:`air_hpc.launch.route`), and why."""
    from air_hpc.launch.chain import dependency
    from air_hpc.launch.route import check_routable, planned_start, route_job

    check_routable(executor, "job", waits)
    routed = route_job(
        job,
        clusters.split(","),
        client,
        planned_start(python, dependency(None, chain)),
        lambda line: click.echo(f"warning: {line}", err=True),
    )
    if not as_json:
        click.echo(f"route: {routed.decision.reason}", err=True)
    return routed.job, routed.client, routed.decision


def _say_submitted(done: "Submission") -> None:
    for note in done.plan.notes:
        click.echo(f"note: {note}", err=True)
    click.echo(f"run dir {done.run_dir}", err=True)
    if done.route is not None:
        click.echo(f"submitted to cluster {done.route.cluster}", err=True)
    if done.chain:
        click.echo(f"chain of {len(done.chain)} links, one at a time: {' '.join(done.chain)}", err=True)
    click.echo("\n".join(done.chain) if done.chain else done.job_id)


def _dry_run(
    job: "JobConfig",
    client: "SlurmClient",
    executor: str,
    python: str | None,
    dependency: str | None,
    fresh: bool,
    as_json: bool,
) -> None:
    """Validate and render (and sbatch --test-only); submit nothing."""
    from air_hpc.launch import submit as submitting
    from air_hpc.launch.executors import make_executor
    from air_hpc.launch.resume import aside_path
    from air_hpc.records.rundir import RunDir

    make_executor(executor, client).check(job)  # type: ignore[arg-type]
    submitting.check_data(job)
    local = executor == "local"
    planned = submitting.plan(job, None if local else client, python=python, test_only=True, dependency=dependency)
    _report_dry_run(planned, as_json)
    if fresh and job.run.dir.exists() and not as_json:
        click.echo(f"dry run: --fresh would move {job.run.dir} aside to {aside_path(RunDir.of(job))}", err=True)


def _waits_for(job: "JobConfig", client: "SlurmClient", executor: str, after: str | None, chain: int) -> str | None:
    """``--after`` as Slurm's dependency (``afterok:12``; an unknown job exits 2); a chain's partition checked."""
    from air_hpc.launch.chain import chain_note, check_chain, parse_after
    from air_hpc.ops.depend import after_job_id

    check_chain(job, executor, chain)
    warning = chain_note(job, client) if chain > 1 else None
    if warning is not None:
        click.echo(f"warning: {warning}", err=True)
    if after is None:
        return None
    wanted = parse_after(after)
    return f"{wanted.kind}:{after_job_id(wanted.target, client)}"


def _report_dry_run(planned: "Plan", as_json: bool) -> None:
    test_only = planned.test_only
    if as_json:
        echo_json(
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


def _wait_and_summarize(done: "Submission", client: "SlurmClient", as_json: bool) -> None:
    from rich.console import Console

    from air_hpc.errors import TrainingFailed
    from air_hpc.ops.control import run_status, watch_run
    from air_hpc.ops.waiting import describe_failure, poll_until, wait_deadline_s, wait_local
    from air_hpc.records.rundir import RunDir

    run_dir = RunDir(done.run_dir)
    timeout_s = wait_deadline_s(done.plan.job) * max(1, len(done.chain))

    def poll() -> "RunStatus":
        if done.executor == "local":
            done.handle.done()  # reaps the finished controller, so its PID no longer reads as alive
        return run_status(run_dir, client)

    if as_json:
        for _ in poll_until(
            poll,
            lambda status: status.ended,
            timeout_s=timeout_s,
            poll_s=2.0,
            what=lambda status: f"job {status.job.job_id} is {status.job.state}",
        ):
            pass
    else:
        click.echo(f"submitted job {done.job_id} ({done.executor}); run dir {done.run_dir}")
        watch_run(poll, Console(), timeout_s=timeout_s)
    if done.executor == "local":
        wait_local(run_dir, done.job_id, timeout_s=timeout_s)
    status = run_status(run_dir, client)
    if as_json:
        echo_json(status.to_json())
    else:
        click.echo(_summary(status))
        if status.progress is not None:
            click.echo(f"progress {status.progress.describe()}")
    if not status.job.state.succeeded:
        raise TrainingFailed(describe_failure(status.job))


def _summary(status: "RunStatus") -> str:
    lines = [
        f"run      {status.run_dir.path}",
        f"job      {status.job.job_id} ({status.submission.executor}): "
        + with_reason(str(status.job.state), status.job.reason),
    ]
    if status.submission.cluster:
        lines.append(f"cluster  {status.submission.cluster}")
    if status.job.nodelist:
        lines.append(f"nodes    {status.job.nodelist} ({status.job.nodes})")
    if status.job.elapsed:
        lines.append(f"elapsed  {status.job.elapsed}")
    lines.append(f"restarts {status.restarts}")
    if status.job.exit_code is not None:
        lines.append(f"exit     {status.job.exit_code}")
    if status.bad_nodes:
        lines.append(f"bad      {','.join(status.bad_nodes)}")
    if status.stopped_because:
        lines.append(f"stopped  {status.stopped_because}")
    if status.last_crash:
        lines.append(f"crash    {status.last_crash}")
    return "\n".join(lines)


def _print_queue(client: "SlurmClient", as_json: bool) -> None:
    """Your queued and running jobs; a pending one with Slurm's reason and its plain words."""
    records = client.squeue(user=getpass.getuser())
    if as_json:
        keys = ("job_id", "state", "nodelist", "name", "reason")
        echo_json([{**{k: str(getattr(r, k)) for k in keys}, "reason_text": plain_reason(r.reason)} for r in records])
        return
    for r in records:
        why = f"  ({plain_reason(r.reason)})" if not r.nodelist and plain_reason(r.reason) != r.reason else ""
        click.echo(f"{r.job_id:>8}  {r.state!s:<11} {r.nodes:>3}  {r.nodelist or r.reason:<16} {r.name}{why}")


@click.command()
@click.argument("target", required=False, metavar="[RUN_OR_JOB]")
@click.option("--watch", is_flag=True, help="Follow the run until its job ends: a live panel, or a line per change.")
@json_option
def status(target: str | None, watch: bool, as_json: bool) -> None:
    """State of a run (directory, name or job file) or a Slurm job id; without one, your queued jobs."""
    from air_hpc.ops.control import run_status
    from air_hpc.ops.runs import resolve_run

    client = slurm_client()
    if watch and (target is None or as_json):
        raise UserError("--watch follows one run: give RUN, and no --json")
    if target is None:
        _print_queue(client, as_json)
        return
    if ascii_int(target) is not None and not Path(target).exists() and not watch:
        from air_hpc.ops.control import find_job

        job, cluster = find_job(target, client)
        if job is None:
            raise UserError(f"job {target}: neither squeue nor sacct knows it (on any cluster slurmdbd knows)")
        if as_json:
            echo_json({**job.to_json(), "cluster": cluster})
        else:
            where = f" on cluster {cluster}" if cluster else ""
            click.echo(
                f"job {job.job_id} ({job.name}){where}: {with_reason(str(job.state), job.reason)}, {job.nodes} "
                f"node(s) {job.nodelist}, restarts {job.restarts}"
            )
        return
    from air_hpc.ops.sweeps import find_sweep

    record = None if watch else find_sweep(target)
    if record is not None:
        _sweep_runs(target, None, client, as_json)
        return
    run_dir = resolve_run(target)
    if watch:
        from rich.console import Console

        from air_hpc.ops.control import watch_run
        from air_hpc.ops.waiting import run_deadline_s

        watch_run(lambda: run_status(run_dir, client), Console(), timeout_s=run_deadline_s(run_dir))
        return
    result = run_status(run_dir, client)
    if as_json:
        echo_json(result.to_json())
        return
    click.echo(_summary(result))
    if result.progress is not None:
        from rich.console import Console

        from air_hpc.observe.progress import progress_view

        Console().print(progress_view(result.progress))


@click.command()
@run_argument
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output until the job ends.")
@click.option(
    "--rank",
    type=click.IntRange(min=0),
    help="Only this rank's output (its log and what it printed). The step lines with the loss are in the "
    "last pipeline stage's logs: its ranks are the last WORLD/PP (2 and 3 of TP2xPP2 on 4 ranks).",
)
@click.option("--grep", "pattern", metavar="REGEX", help="Only lines matching this regular expression.")
@json_option
def logs(run: str, follow: bool, rank: int | None, pattern: str | None, as_json: bool) -> None:
    """Print a run's output (the batch log, or one rank's), each file under a ``==> file <==`` header."""
    from air_hpc.ops.control import check_rank, log_sources, run_status
    from air_hpc.ops.runs import resolve_run
    from air_hpc.records.submissions import latest_submission

    if follow and as_json:
        raise UserError("--follow and --json: choose one (--json prints what is there now)")
    try:
        matcher = re.compile(pattern) if pattern is not None else None
    except re.error as exc:
        raise UserError(f"--grep {pattern!r}: not a regular expression: {exc}") from None
    run_dir = resolve_run(run)
    check_rank(run_dir, rank)
    record = latest_submission(run_dir)
    tail = _LogTail(run_dir, log_sources(run_dir, record, rank), matcher, as_json)
    tail.drain(whole=not follow)
    if not any(source.path.exists() for source in tail.sources) and not follow:
        looked = ", ".join(tail.label(source.path) for source in tail.sources)
        raise UserError(f"{run}: no output yet for job {record.job_id} (looked for {looked})")
    if as_json:
        echo_json({"run_dir": str(run_dir.path), "job_id": record.job_id, "rank": rank, "lines": tail.collected})
        return
    if not follow:
        return
    client = slurm_client()
    while True:
        time.sleep(1.0)
        tail.drain(whole=False)
        if run_status(run_dir, client).job.state.terminal:
            time.sleep(1.0)
            tail.drain(whole=True)
            return


class _LogTail:
    """What each log source gained since the last :meth:`drain`: printed under headers, or collected for --json."""

    def __init__(
        self, run_dir: "RunDir", sources: "list[LogSource]", matcher: "re.Pattern[str] | None", as_json: bool
    ) -> None:
        self.run_dir = run_dir
        self.sources = sources
        self.matcher = matcher
        self.as_json = as_json
        self.offsets = {source: 0 for source in sources}
        self.shown_last: Path | None = None
        self.collected: list[dict[str, str]] = []

    def label(self, path: Path) -> str:
        return str(path.relative_to(self.run_dir.path)) if path.is_relative_to(self.run_dir.path) else str(path)

    def drain(self, whole: bool) -> None:
        """Print what was appended; while following, hold back a line still being written."""
        for source in self.sources:
            try:
                with source.path.open("rb") as handle:
                    handle.seek(self.offsets[source])
                    data = handle.read()
            except FileNotFoundError:
                continue
            complete = data if whole else data[: data.rfind(b"\n") + 1]
            self.offsets[source] += len(complete)
            lines = source.select(complete.decode(errors="replace").splitlines())
            if self.matcher is not None:
                lines = [line for line in lines if self.matcher.search(line)]
            if self.as_json:
                self.collected.extend({"file": self.label(source.path), "line": line} for line in lines)
                continue
            if lines and self.shown_last != source.path:
                click.echo(f"==> {self.label(source.path)} <==")
                self.shown_last = source.path
            for line in lines:
                click.echo(line)


@click.command()
@run_argument
@json_option
def cancel(run: str, as_json: bool) -> None:
    """Cancel a run's current job; one that had already ended is left alone and its end state said.

    A sweep's name cancels every element; ``SWEEP/i`` cancels element i.
    """
    from air_hpc.ops.control import cancel_run
    from air_hpc.ops.runs import resolve_run
    from air_hpc.ops.sweeps import find_element, find_sweep
    from air_hpc.records.rundir import RunDir

    record = find_sweep(run)
    if record is not None:
        _cancel_sweep(record, as_json)
        return
    element = find_element(run)
    run_dir = RunDir(element[1].run_dir) if element is not None else resolve_run(run)
    outcome = cancel_run(run_dir, slurm_client())
    if as_json:
        echo_json(outcome.to_json(run_dir))
    else:
        click.echo(outcome.message())


@click.command()
@click.option(
    "--root",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory holding the run directories [default: $AIR_HPC_RUNS_ROOT, else ./runs].",
)
@click.option(
    "--sweep", "sweep_name", metavar="NAME", help="Only this sweep's elements, with their settings, best first."
)
@json_option
def runs(root: str | None, sweep_name: str | None, as_json: bool) -> None:
    """List the runs under the runs root: state, step/total, loss, restarts, goodput, checkpoint age, job.

    A run whose own files cannot be read (an empty ``job.json``) is listed as
    ``unreadable`` and why is said on stderr; the other runs are listed as usual.
    """
    from air_hpc.observe.overview import runs_table
    from air_hpc.ops.runs import find_runs, runs_root
    from air_hpc.ops.sweeps import runs_row

    client = slurm_client()
    if sweep_name is not None:
        _sweep_runs(sweep_name, root, client, as_json)
        return
    rows = [runs_row(run_dir, client) for run_dir in find_runs(root)]
    if as_json:
        echo_json({"root": str(runs_root(root)), "runs": [row.to_json() for row in rows]})
        return
    if not rows:
        click.echo(f"no runs under {runs_root(root)}")
        return
    from rich.console import Console

    console = Console()
    # Piped: no terminal width to fit, so keep each run on one line for grep and awk.
    (console if console.is_terminal else Console(width=250)).print(runs_table(rows))
    for row in rows:
        if row.problem is not None:
            click.echo(f"warning: run {row.summary.name} is unreadable: {row.problem}", err=True)


def _sweep(target: str, root: str | None = None) -> "SweepRecord":
    """The sweep a command names; an unknown name is a one-line error with the sweeps there are."""
    from air_hpc.ops.runs import runs_root
    from air_hpc.ops.sweeps import find_sweep
    from air_hpc.records.sweeps import SUFFIX

    record = find_sweep(target, root)
    if record is None:
        base = runs_root(root)
        known = sorted(p.name.removesuffix(SUFFIX) for p in base.glob(f"*{SUFFIX}")) if base.is_dir() else []
        raise UserError(f"{target}: no sweep under {base} (sweeps there: {', '.join(known) or 'none'})")
    return record


def _sweep_runs(name: str, root: str | None, client: "SlurmClient", as_json: bool) -> None:
    from air_hpc.cli.sweep_cmd import print_rows
    from air_hpc.ops.sweeps import sweep_rows

    record = _sweep(name, root)
    rows = sweep_rows(record, client)
    if as_json:
        echo_json({**record.to_json(), "elements": [r.to_json() for r in rows]})
        return
    print_rows(rows)


def _cancel_sweep(record: "SweepRecord", as_json: bool) -> None:
    from air_hpc.ops.sweeps import cancel_sweep
    from air_hpc.records.rundir import RunDir

    outcomes = cancel_sweep(record, slurm_client())
    if as_json:
        echo_json(
            {
                "sweep": record.name,
                "elements": [
                    {"index": e.index, **(o.to_json(RunDir(e.run_dir)) if not isinstance(o, str) else {"error": o})}
                    for e, o in outcomes
                ],
            }
        )
        return
    for element, outcome in outcomes:
        click.echo(f"{record.name}/{element.index}: {outcome if isinstance(outcome, str) else outcome.message()}")
