"""``air-hpc demo``: the end-to-end demo on the embedded testbed."""

from pathlib import Path

import click


@click.command()
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Testbed state directory [default: the user's state dir].",
)
@click.option(
    "--runs",
    "run_root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("runs"),
    show_default=True,
    help="Where the demo's run directory and corpus go.",
)
@click.option("--preempt-at-step", default=8, show_default=True, help="Send the preemption signal at this step.")
def demo(state_dir: Path | None, run_root: Path, preempt_at_step: int) -> None:
    """Train gpt-tiny across two emulated nodes, preempt it once, watch it resume, report and plot."""
    from rich.console import Console

    from air_hpc.demo import run_demo

    run_demo(state_dir, run_root.resolve(), click.echo, preempt_at_step, console=Console())
