"""``air-hpc metrics``: every run under a root as Prometheus metrics, in a node_exporter textfile or over HTTP."""

from pathlib import Path

import click

from air_hpc.cli.options import serve_metrics, slurm_client
from air_hpc.errors import UserError


@click.command()
@click.option(
    "--root",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory holding the run directories [default: $AIR_HPC_RUNS_ROOT, else ./runs].",
)
@click.option(
    "--textfile",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the metrics to this *.prom file (atomically) for node_exporter's textfile collector, then exit.",
)
@click.option("--serve", "port", type=click.IntRange(0, 65535), help="Serve /metrics on this port until Ctrl-C.")
@click.option("--bind", default="127.0.0.1", show_default=True, help="Address to serve on.")
def metrics(root: str | None, textfile: Path | None, port: int | None, bind: str) -> None:
    """Per-run step, loss, tokens/s, goodput, restarts, checkpoint and heartbeat age, and state, for Prometheus."""
    # Not at the top: both import prometheus_client, which `air-hpc --help` must not load (tests/unit/test_cli.py).
    from air_hpc.observe.prometheus import registry_of, write_textfile
    from air_hpc.ops.runs import existing_runs_root
    from air_hpc.ops.states import snapshot

    one_of = "give one of --textfile OUT.prom or --serve PORT"
    if (textfile is None) == (port is None):
        raise UserError(one_of)
    if textfile is not None and textfile.suffix != ".prom":
        raise UserError(f"--textfile {textfile}: node_exporter's textfile collector reads only *.prom files")
    base = existing_runs_root(root)
    client = slurm_client()
    registry = registry_of(lambda: snapshot(base, client))
    if textfile is not None:
        write_textfile(textfile, registry)
        click.echo(f"wrote {textfile}")
        return
    assert port is not None  # exactly one of the two, checked above
    serve_metrics(registry, port, bind)
