"""``air-hpc demo``: the end-to-end demo on the embedded testbed."""

from pathlib import Path

import click

from air_hpc.cli.options import state_dir_option


@click.command()
@state_dir_option
@click.option(
    "--runs",
    "run_root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("runs"),
    show_default=True,
    help="Where the demo's run directory and corpus go.",
)
@click.option("--preempt-at-step", default=8, show_default=True, help="Send the preemption signal at this step.")
def demo(state_dir: Path, run_root: Path, preempt_at_step: int) -> None:
    """Train gpt-tiny across two emulated nodes, preempt it once, watch it resume, report and plot."""
    from rich.console import Console

    from air_hpc.demo import run_demo

    run_demo(state_dir, run_root.resolve(), click.echo, preempt_at_step, console=Console())
