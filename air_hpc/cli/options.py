"""Options shared by commands: ``--set``, ``--json`` (and the one JSON style), the run argument, the Slurm client."""

import json
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import click

from air_hpc.slurm.client import SlurmClient

#: Set when a command was given ``--json``, so the error boundary answers in JSON too.
json_requested: ContextVar[bool] = ContextVar("json_requested", default=False)


def _remember_json(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    if value:
        json_requested.set(True)
    return value


set_option = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a config key (repeatable), e.g. --set train.steps=100.",
)
json_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    is_eager=True,
    callback=_remember_json,
    help="Machine-readable JSON output (errors too).",
)


def to_json(data: Any) -> str:
    """The one JSON style of every ``--json`` output: indented, keys sorted."""
    return json.dumps(data, indent=2, sort_keys=True, default=str)


def echo_json(data: Any) -> None:
    click.echo(to_json(data))


def job_argument(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.argument("job_file", type=click.Path(dir_okay=False))(func)


def run_argument(func: Callable[..., Any]) -> Callable[..., Any]:
    """RUN: a run directory, a run name under the runs root, or the run's job file."""
    return click.argument("run", metavar="RUN")(func)


def slurm_client() -> SlurmClient:
    """The Slurm client of this command: injected through the click context object in tests, else a real one."""
    obj = click.get_current_context().obj
    injected = obj.get("slurm_client") if isinstance(obj, dict) else None
    return injected if isinstance(injected, SlurmClient) else SlurmClient(retries=2, backoff_s=1.0)
