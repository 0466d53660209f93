"""``air-hpc chaos JOB_FILE --faults ... --count N --seed S``: a seeded fault campaign on the testbed."""

import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import click

from air_hpc.chaos.schedule import FAULT_KINDS
from air_hpc.cli.options import echo_json, job_argument, json_option, set_option, state_dir_option
from air_hpc.exitcodes import ExitCode

if TYPE_CHECKING:
    from air_hpc.chaos.outcome import Injection


def say(line: str) -> None:
    """A progress line on stderr, as the campaign goes (stdout keeps the verdict, or the JSON)."""
    click.echo(f"chaos: {line}", err=True)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM (a timeout's, a scheduler's) ends the campaign as Ctrl-C does, through its clean-up: stopped ranks
    continue and both copies are cancelled, instead of leaving a job running with a stopped rank."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@click.command()
@job_argument
@set_option
@click.option(
    "--faults",
    "faults_text",
    required=True,
    help=f"Comma-separated fault kinds: {', '.join(FAULT_KINDS)}.",
)
@click.option("--count", type=int, required=True, help="How many faults to inject (kinds chosen and timed by --seed).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the fault schedule.")
@click.option("--timeout-s", type=float, default=900.0, show_default=True, help="Longest wait for any one thing.")
@state_dir_option
@json_option
def chaos(
    job_file: str,
    overrides: tuple[str, ...],
    faults_text: str,
    count: int,
    seed: int,
    timeout_s: float,
    state_dir: Path,
    as_json: bool,
) -> None:
    """Run JOB_FILE on the testbed beside an uninterrupted reference, inject faults, compare bit for bit.

    Exit 0 only when nothing was lost: the run completed, recovered from every
    fault that struck, and every logged loss and the final weights equal the
    reference's. A fault that could no longer strike (the run had trained its
    last step, or the job ended) is reported as skipped, with the reason; it
    loses nothing. Exit 1 otherwise: the verdict line says what was lost.
    """
    from air_hpc.chaos.campaign import Campaign, run_campaign, testbed_job, timeout_warning
    from air_hpc.chaos.outcome import format_result
    from air_hpc.chaos.schedule import parse_kinds, plan
    from air_hpc.testbed import Testbed

    kinds = parse_kinds(faults_text)
    job = testbed_job(Path(job_file), overrides)
    plan(kinds, count, seed, job.train.steps)  # bad input fails before the testbed starts
    if warning := timeout_warning(job, kinds, timeout_s):
        click.echo(f"warning: {warning}", err=True)
    bed = Testbed(state_dir)
    say(f"testbed {bed.layout.root}")
    status = bed.up()
    campaign = Campaign(Path(job_file), overrides, kinds, count, seed, Path(status["topology_conf"]), timeout_s)

    def announce(injection: "Injection") -> None:
        hit = injection.target or f"skipped: {injection.skipped}"
        say(f"fault {injection.fault.number} {injection.fault.kind} at step {injection.step}: {hit}")

    with sigterm_interrupts():
        result, _, run_dir, reference = run_campaign(campaign, bed.client(), announce, node_control=bed, say=say)
    if as_json:
        echo_json({**result.to_json(), "run_dir": str(run_dir.path), "reference_run_dir": str(reference.path)})
    else:
        click.echo(f"run {run_dir.path}\nreference {reference.path}")
        click.echo(format_result(result))
    if result.exit_code != ExitCode.OK:
        click.get_current_context().exit(result.exit_code)  # the verdict above says what was lost
