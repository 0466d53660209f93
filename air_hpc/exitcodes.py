"""The exit-code contract between the trainer, the batch script and the CLI.

This is the one place these numbers live. The batch script template and the
resilience code import them from here; nothing else may hard-code them.

- ``OK``: the run finished; Slurm records COMPLETED.
- ``FAILURE``: an unexpected error, a crash. Like any other code not named here
  (a rank killed by a signal, srun's own failure) it is requeued within the restart
  budget; a crash that repeats without progress ends in ``CRASH_LOOP``.
- ``USAGE``: a user mistake (bad config, bad input file, a job that does not own its
  run directory); printed as one line, never requeued (it would fail the same way).
- ``REQUEUE``: a checkpoint was saved because of a signal or the time limit;
  the batch script requeues the job if the restart budget allows.
- ``HUNG``: the watchdog saw a rank make no progress; requeue-worthy, and the
  suspect node goes on the run's bad-node list.
- ``UNHEALTHY``: the pre-flight health check failed on a node; requeue-worthy
  with that node excluded.
- ``UNREACHABLE``: the Slurm controller did not answer within the retries; never requeued.
- ``CRASH_LOOP``: ``resilience.max_no_progress_restarts`` restarts in a row saved no
  new checkpoint; never requeued, whatever the restart budget.
"""

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILURE = 1
    USAGE = 2
    UNREACHABLE = 3
    REQUEUE = 85
    HUNG = 86
    UNHEALTHY = 87
    CRASH_LOOP = 88


REQUEUE_WORTHY: frozenset[ExitCode] = frozenset({ExitCode.REQUEUE, ExitCode.HUNG, ExitCode.UNHEALTHY})
"""Stops that were planned for: a checkpoint was saved, or a node was blamed and goes on the bad-node list."""

NEVER_REQUEUED: frozenset[ExitCode] = frozenset(
    {ExitCode.OK, ExitCode.USAGE, ExitCode.UNREACHABLE, ExitCode.CRASH_LOOP}
)
"""Ends a requeue cannot change; every other code is a crash, requeued within the restart budget."""
