"""Entry point and the one error boundary of the CLI.

Subcommands are imported lazily so ``air-hpc --help`` never imports torch or
Megatron. Library code raises :class:`~air_hpc.errors.AirHpcError`; only
:func:`main` turns it into one line on stderr and the error's exit code.
"""

import importlib
import logging
import os
import sys
from typing import Any

import click

from air_hpc import __version__
from air_hpc.cli.options import json_requested, to_json
from air_hpc.errors import AirHpcError
from air_hpc.exitcodes import ExitCode

#: name -> "module:attribute" of each subcommand; imported only when used.
COMMANDS: dict[str, str] = {
    "config": "air_hpc.cli.config_cmd:config",
    "render": "air_hpc.cli.job_cmds:render",
    "submit": "air_hpc.cli.job_cmds:submit",
    "sweep": "air_hpc.cli.sweep_cmd:sweep",
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
    "runs": "air_hpc.cli.job_cmds:runs",
    "doctor": "air_hpc.cli.cluster_cmds:doctor",
    "cluster": "air_hpc.cli.cluster_cmds:cluster",
    "metrics": "air_hpc.cli.metrics_cmd:metrics",
    "chaos": "air_hpc.cli.chaos_cmd:chaos",
    "fleet": "air_hpc.cli.fleet_cmd:fleet",
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
    if verbose:  # the jobs it submits inherit the environment: their ranks keep every import-time warning too
        from air_hpc.train.metrics import VERBOSE_ENV

        os.environ[VERBOSE_ENV] = str(verbose)


def _fail(message: str, exit_code: int) -> None:
    """Say what went wrong once: a line per problem on stderr, or ``{"error", "exit_code"}`` when --json was given."""
    if json_requested.get():
        click.echo(to_json({"error": message, "exit_code": exit_code}))
    else:
        click.echo(message, err=True)
    sys.exit(exit_code)


def main(argv: list[str] | None = None) -> Any:
    json_requested.set(False)
    try:
        result = cli.main(args=argv, prog_name="air-hpc", standalone_mode=False)
    except AirHpcError as exc:
        _fail(exc.error_lines(), int(exc.exit_code))
    except click.exceptions.Abort:
        _fail("aborted", 130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exit_code = ExitCode.USAGE if exc.exit_code == 2 else exc.exit_code
        # A usage error can stop parsing before --json was processed: then the words tell.
        if json_requested.get() or "--json" in (sys.argv[1:] if argv is None else argv):
            json_requested.set(True)
            _fail(f"error: {exc.format_message()}", exit_code)
        exc.show()
        sys.exit(exit_code)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    # A command that ends with ``ctx.exit(N)`` (a verdict such as chaos's or doctor's, not an error) comes back
    # from click here as N, in every entry point (``air-hpc``, ``python -m air_hpc``, tests calling main()).
    if isinstance(result, int) and result != 0:
        sys.exit(result)
    return result


if __name__ == "__main__":  # ``python -m air_hpc.cli.main`` (``python -m air_hpc`` and ``air-hpc`` are the usual ways)
    main()
