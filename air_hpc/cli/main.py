"""Entry point and the one error boundary of the CLI.

Subcommands are imported lazily so ``air-hpc --help`` never imports torch or
Megatron. Library code raises :class:`~air_hpc.errors.AirHpcError`; only
:func:`main` turns it into one line on stderr and the error's exit code.
"""

import importlib
import logging
import sys
from typing import Any

import click

from air_hpc import __version__
from air_hpc.errors import AirHpcError
from air_hpc.exitcodes import ExitCode

#: name -> "module:attribute" of each subcommand; imported only when used.
COMMANDS: dict[str, str] = {
    "config": "air_hpc.cli.config_cmd:config",
    "render": "air_hpc.cli.job_cmds:render",
    "submit": "air_hpc.cli.job_cmds:submit",
    "status": "air_hpc.cli.job_cmds:status",
    "logs": "air_hpc.cli.job_cmds:logs",
    "cancel": "air_hpc.cli.job_cmds:cancel",
    "testbed": "air_hpc.cli.testbed_cmd:testbed",
    "demo": "air_hpc.cli.demo_cmd:demo",
    "data": "air_hpc.cli.data_cmd:data",
    "ckpt": "air_hpc.cli.ckpt_cmd:ckpt",
    "plot": "air_hpc.cli.observe_cmds:plot",
    "report": "air_hpc.cli.observe_cmds:report",
    "topo": "air_hpc.cli.topo_cmd:topo",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, _, attr = target.partition(":")
        command = getattr(importlib.import_module(module_name), attr)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="air-hpc")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def cli(verbose: int) -> None:
    """Topology-aware, preemption-proof Megatron-core training on Slurm."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def main(argv: list[str] | None = None) -> Any:
    try:
        return cli.main(args=argv, prog_name="air-hpc", standalone_mode=False)
    except AirHpcError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(int(exc.exit_code))
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(ExitCode.USAGE if exc.exit_code == 2 else exc.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
