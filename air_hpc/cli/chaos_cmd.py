"""``air-hpc chaos JOB_FILE --faults ... --count N --seed S``: a seeded fault campaign on the testbed."""

from pathlib import Path
from typing import TYPE_CHECKING

import click

from air_hpc.cli.options import echo_json, job_argument, json_option, set_option
from air_hpc.cli.testbed_cmd import state_dir_option
from air_hpc.exitcodes import ExitCode

if TYPE_CHECKING:
    from air_hpc.chaos.outcome import Injection


@click.command()
@job_argument
@set_option
@click.option(
    "--faults",
    "faults_text",
    required=True,
    help="Comma-separated fault kinds: preempt, slurm-preempt, node-kill, rank-kill, hang, straggler, ckpt-kill.",
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
    state_dir: Path | None,
    as_json: bool,
) -> None:
    """Run JOB_FILE on the testbed beside an uninterrupted reference, inject faults, compare bit for bit.

    Exit 0 only when nothing was lost: the run completed, recovered from every
    fault that struck, and every logged loss and the final weights equal the
    reference's. A fault that could no longer strike (the run had trained its
    last step, or the job ended) is reported as skipped, with the reason; it
    loses nothing. Exit 1 otherwise: the verdict line says what was lost.
    """
    from air_hpc.chaos.campaign import Campaign, run_campaign, testbed_job
    from air_hpc.chaos.outcome import format_result
    from air_hpc.chaos.schedule import parse_kinds, plan
    from air_hpc.testbed import Testbed

    kinds = parse_kinds(faults_text)
    plan(
        kinds, count, seed, testbed_job(Path(job_file), overrides).train.steps
    )  # bad input fails before the testbed starts
    bed = Testbed(state_dir)
    status = bed.up()
    campaign = Campaign(Path(job_file), overrides, kinds, count, seed, Path(status["topology_conf"]), timeout_s)

    def announce(injection: "Injection") -> None:
        if not as_json:
            hit = injection.target or f"skipped: {injection.skipped}"
            click.echo(f"fault {injection.fault.number} {injection.fault.kind}: {hit}", err=True)

    result, _, run_dir, reference = run_campaign(campaign, bed.client(), announce, node_control=bed)
    if as_json:
        echo_json({**result.to_json(), "run_dir": str(run_dir.path), "reference_run_dir": str(reference.path)})
    else:
        click.echo(f"run {run_dir.path}\nreference {reference.path}")
        click.echo(format_result(result))
    if result.exit_code != ExitCode.OK:
        click.get_current_context().exit(result.exit_code)  # the verdict above says what was lost
