"""One exception root; every error carries the exit code the CLI should use.

Messages are written for the person at the terminal: what is wrong, where
(file, line or key), and what is expected instead.
"""

from air_hpc.exitcodes import ExitCode


class AirHpcError(Exception):
    """Root of every error air-hpc raises on purpose."""

    exit_code: int = ExitCode.FAILURE

    def error_lines(self) -> str:
        """``error: `` before each line (a config error names every broken rule on a line of its own)."""
        return "\n".join(f"error: {line}" for line in str(self).splitlines())


class UserError(AirHpcError):
    """A mistake in what the user gave us: config, arguments, input files."""

    exit_code = ExitCode.USAGE


class ConfigError(UserError):
    """An invalid or unknown configuration key or value."""


class InputError(UserError):
    """A malformed input file (topology dump, HDF5 data, hostlist, ...)."""


class TopologyError(UserError):
    """A fabric description that cannot be parsed or a selection that cannot be met."""


class RouteError(UserError):
    """``submit --clusters``: no cluster named answered, so the job cannot be routed (nothing is submitted)."""


class SlurmError(AirHpcError):
    """A Slurm command failed; the message keeps its stderr."""


class SlurmUnreachableError(SlurmError):
    """The controller did not answer after bounded retries."""

    exit_code = ExitCode.UNREACHABLE


class SlurmNotConfiguredError(SlurmUnreachableError):
    """Slurm's commands found no cluster configuration (no slurm.conf, no configless source): no cluster to ask.

    An unreachable cluster to everything that carries on without one (a skipped
    ``--test-only``), but said as what it is, at once, and a mistake to fix (exit 2).
    """

    exit_code = ExitCode.USAGE


class JobRefusedError(SlurmError):
    """sbatch refused the job for what it asks (an account, QOS or partition it may not use): the request is
    wrong, not the cluster, so a mistake to fix (exit 2)."""

    exit_code = ExitCode.USAGE


class AccountingUnreachableError(SlurmError):
    """slurmdbd (``sacct``'s daemon) does not answer; slurmctld may well, so the queue can still be asked."""

    exit_code = ExitCode.UNREACHABLE


class SlurmCommandMissing(SlurmError):
    """A Slurm command is not installed (not on ``PATH``)."""


class AccountingMissingError(SlurmError):
    """What a report built on Slurm's accounting needs is missing: ``sacct``, or a slurmdbd that answers.

    Said in one line and a setup to fix (exit 2), not an outage to wait out.
    """

    exit_code = ExitCode.USAGE


class TrainingFailed(AirHpcError):
    """A submitted job ended without completing."""


class WaitTimeoutError(AirHpcError):
    """A job outlived the deadline of a wait for it (the job itself keeps running)."""


class TestbedError(AirHpcError):
    """The embedded Slurm testbed could not be brought up or down."""

    __test__ = False  # not a pytest test class, despite the name


class CheckpointError(AirHpcError):
    """A checkpoint is missing, incomplete or corrupt."""


class UnusableCheckpointsError(CheckpointError):
    """Checkpoints exist but none verifies: refuse to train over them from scratch."""

    exit_code = ExitCode.USAGE
