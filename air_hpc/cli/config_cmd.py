"""``air-hpc config show``: the fully resolved job config."""

import click
import yaml

from air_hpc.cli.options import echo_json, job_argument, json_option, set_option
from air_hpc.config import load_job


@click.group()
def config() -> None:
    """Inspect job configs."""


@config.command()
@job_argument
@set_option
@json_option
def show(job_file: str, overrides: tuple[str, ...], as_json: bool) -> None:
    """Print JOB_FILE resolved: profiles composed, overrides applied, validated (its data sources too)."""
    from air_hpc.data.blend import precheck

    job = load_job(job_file, overrides)
    precheck(job.data, job.model.seq_len)
    data = job.model_dump(mode="json")
    data["derived"] = {
        "world_size": job.resources.world_size,
        "layout": {"tp": job.layout.tp, "pp": job.layout.pp, "dp": job.layout.dp, "vpp": job.layout.vpp},
        "precision": job.precision,
        "run_dir": str(job.run.dir),
    }
    if as_json:
        echo_json(data)
    else:
        click.echo(yaml.safe_dump(data, sort_keys=False), nl=False)
