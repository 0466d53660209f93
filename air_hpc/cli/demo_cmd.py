"""``air-hpc demo``: the end-to-end demo on the embedded testbed."""

from pathlib import Path

import click

from air_hpc.errors import AirHpcError


@click.command()
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Testbed state directory [default: the user's state dir].",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("runs/demo"),
    show_default=True,
    help="Where the demo writes its outputs.",
)
def demo(state_dir: Path | None, out_dir: Path) -> None:
    """Bring up the testbed and run a job across two emulated nodes."""
    from air_hpc.demo import hello_nodes

    state = hello_nodes(state_dir, out_dir.resolve(), click.echo)
    if state != "COMPLETED":
        raise AirHpcError(f"demo job ended {state}")
