"""Options shared by every command that takes a job config."""

from collections.abc import Callable
from typing import Any

import click

set_option = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a config key (repeatable), e.g. --set train.steps=100.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")


def job_argument(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.argument("job_file", type=click.Path(dir_okay=False))(func)
