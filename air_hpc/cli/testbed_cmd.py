"""``air-hpc testbed up|down|status|env``: the embedded local Slurm cluster."""

import shlex
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from air_hpc.cli.options import echo_json, json_option, state_dir_option
from air_hpc.errors import UserError
from air_hpc.testbed import Testbed
from air_hpc.testbed.conf import Settings


def parse_leaves(value: str) -> tuple[int, ...]:
    try:
        leaves = tuple(int(part) for part in value.split(","))
    except ValueError:
        raise UserError(f"--leaves {value!r}: expected comma-separated node counts per leaf, e.g. 2,4,2") from None
    if not leaves or min(leaves) < 1:
        raise UserError(f"--leaves {value!r}: every leaf needs at least one node")
    return leaves


@click.group()
def testbed() -> None:
    """A real Slurm cluster on loopback: slurmctld, slurmdbd and one slurmd per emulated node."""


@testbed.command()
@state_dir_option
@click.option("--leaves", default="2,4,2", show_default=True, help="Nodes per leaf switch, all under one spine.")
@click.option(
    "--preempt-grace-s",
    type=click.IntRange(min=0),
    default=Settings.preempt_grace_s,
    show_default=True,
    help="GraceTime of the batch partition: seconds between Slurm's preemption signal and the kill.",
)
@click.option(
    "--preempt-send-user-signal",
    is_flag=True,
    help="Preemption sends the job's --signal instead of SIGTERM (SlurmctldParameters=preempt_send_user_signal).",
)
@click.option(
    "--tenants",
    is_flag=True,
    help="Accounts research, product and ops (users, node quotas GrpTRES=node=N, fair shares) and QOS tiers "
    "high, normal and scavenger in slurmdbd, enforced (AccountingStorageEnforce=associations,limits,qos), "
    "with priority/multifactor.",
)
@click.option(
    "--preempt-by",
    type=click.Choice(["partition", "qos"]),
    default=None,
    help="What lets a job preempt another: its partition (urgent over batch) or its QOS (high over scavenger; "
    "needs --tenants). [default: qos with --tenants, else partition]",
)
@click.option(
    "--clusters",
    type=click.IntRange(1, 2),
    default=1,
    show_default=True,
    help="Slurm clusters: 2 adds a second (airtbb, nodes b1...) with its own slurmctld and slurmds, registered in "
    "the same slurmdbd (Slurm's multi-cluster operation: -M airtbb); `testbed status --json` lists their files.",
)
@click.option(
    "--slurm-prefix",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Run this Slurm build (scripts/slurm-build.sh SOURCE PREFIX) instead of the system's: its daemons, "
    "and its commands for everything run against the testbed.",
)
def up(
    state_dir: Path,
    leaves: str,
    preempt_grace_s: int,
    preempt_send_user_signal: bool,
    tenants: bool,
    preempt_by: str | None,
    clusters: int,
    slurm_prefix: Path | None,
) -> None:
    """Start the testbed (safe to run twice) and wait until every node is idle.

    On a partly running testbed only the daemons that are down start again; running jobs are left alone.

    Two partitions share the nodes: `batch` (the default) and `urgent`, whose jobs preempt `batch` jobs
    (with --preempt-by qos: jobs of QOS `high` preempt those of QOS `scavenger` instead).
    """
    if preempt_by == "qos" and not tenants:
        raise UserError("--preempt-by qos: preemption by QOS needs the QOS tiers of --tenants")
    settings = Settings(
        preempt_grace_s=preempt_grace_s,
        preempt_send_user_signal=preempt_send_user_signal,
        tenants=tenants,
        clusters=clusters,
        preempt_by="qos" if preempt_by == "qos" or (preempt_by is None and tenants) else "partition",
    )
    bed = Testbed(state_dir)
    status = bed.up(parse_leaves(leaves), settings=settings, slurm_prefix=slurm_prefix)
    _print_status(status)
    for key, value in sorted(bed.env.items()):
        click.echo(f"export {key}={shlex.quote(value)}")


@testbed.command()
@state_dir_option
def down(state_dir: Path) -> None:
    """Stop every daemon the testbed started, by PID, and wait for them."""
    stopped = Testbed(state_dir).down()
    click.echo(f"stopped {len(stopped)} daemon(s)" if stopped else "testbed was not running")


@testbed.command()
@state_dir_option
@json_option
def status(state_dir: Path, as_json: bool) -> None:
    """Show nodes, their states and the daemons' PIDs."""
    info = Testbed(state_dir).status()
    if as_json:
        echo_json(info)
    else:
        _print_status(info)


@testbed.command()
@state_dir_option
def env(state_dir: Path) -> None:
    """Print shell exports for using the testbed: eval "$(air-hpc testbed env)"."""
    for key, value in sorted(Testbed(state_dir).env.items()):
        click.echo(f"export {key}={shlex.quote(value)}")


def _print_status(info: dict[str, Any]) -> None:
    console = Console()
    if not info["up"]:
        console.print(f"testbed in {info['state_dir']} is [bold red]down[/]")
        return
    slurm = f"Slurm {info.get('slurm_version') or '?'}"
    if info.get("slurm_prefix"):
        slurm += f" from {info['slurm_prefix']}"
    table = Table(title=f"testbed {info['state_dir']} ({slurm})")
    table.add_column("node")
    table.add_column("state")
    further = info.get("clusters", [])[1:]
    if further:
        table.add_column("cluster")
    own = [info.get("clusters", [{}])[0].get("name", "")] if further else []
    for node, state in info["nodes"].items():
        table.add_row(node, state, *own)
    for cluster in further:
        for node, state in cluster["nodes"].items():
            table.add_row(node, state, cluster["name"])
    console.print(table)
    for cluster in info.get("clusters", []) if further else []:
        console.print(f"cluster {cluster['name']}: SLURM_CONF={cluster['slurm_conf']}", highlight=False)
    daemons = ", ".join(f"{name}={d['pid']}" for name, d in info["daemons"].items())
    console.print(f"daemons: {daemons}")
    settings = info.get("settings", {})
    if settings.get("tenants"):
        from air_hpc.testbed.tenants import describe

        console.print(f"preemption by {settings.get('preempt_by')}", highlight=False)
        for line in describe(len(info["nodes"])):
            console.print(line, highlight=False)
