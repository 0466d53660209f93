"""Options shared by commands: ``--set``, ``--json`` (and the one JSON style), the run argument, the Slurm client,
the testbed's ``--state-dir``."""

import json
import os
import threading
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from air_hpc.slurm.client import SlurmClient

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

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


def testbed_state_dir(explicit: Path | None, env: Mapping[str, str] | None = None) -> Path:
    """The one rule of every command that works on a testbed: ``--state-dir`` when given, else the testbed
    ``$SLURM_CONF`` belongs to (``eval "$(air-hpc testbed env --state-dir X)"``), else the default."""
    from air_hpc.testbed import default_state_dir
    from air_hpc.testbed.conf import testbed_of

    if explicit is not None:
        return explicit
    conf = (os.environ if env is None else env).get("SLURM_CONF")
    return (testbed_of(Path(conf)) if conf else None) or default_state_dir()


state_dir_option = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    callback=lambda ctx, param, value: testbed_state_dir(value),
    help="Where the testbed keeps all its state [default: the testbed $SLURM_CONF belongs to, as set by "
    "`air-hpc testbed env`, else $XDG_STATE_HOME/air-hpc/testbed].",
)


def serve_metrics(registry: "CollectorRegistry", port: int, addr: str) -> None:
    """Serve ``/metrics`` until Ctrl-C: the per-run and the fleet exporters alike."""
    from air_hpc.observe.prometheus import serve

    host, bound, stop = serve(registry, port, addr)
    click.echo(f"serving http://{host}:{bound}/metrics (Ctrl-C stops)")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        click.echo("stopped")
    finally:
        stop()
