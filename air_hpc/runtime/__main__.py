"""``python -m air_hpc.runtime RUN_DIR``: what the rendered batch script runs under ``srun`` on every rank.

The process exit code is the contract with the batch script (see
:mod:`air_hpc.exitcodes`): 85 asks it to requeue, 2 is a user error printed as one line.
"""

import logging
import os
import sys
from pathlib import Path

from air_hpc.errors import AirHpcError
from air_hpc.exitcodes import ExitCode
from air_hpc.resilience.signals import hold_stop_signals
from air_hpc.runtime import standby
from air_hpc.train.startup import pause_gc


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m air_hpc.runtime RUN_DIR", file=sys.stderr)
        return ExitCode.USAGE
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from air_hpc.runtime.entry import TrainingEntry

    try:
        summary = TrainingEntry(Path(argv[0]))()
    except AirHpcError as exc:
        print(exc.error_lines(), file=sys.stderr)
        return int(exc.exit_code)
    return int(summary.exit_code)


def exit_now(code: int) -> None:
    """Exit without the interpreter's teardown of torch and Megatron.

    Everything the run needs is durable when :func:`main` returns (checkpoints committed, events
    fsynced, logs closed), while the teardown runs C++ destructors for seconds (12 s on a loaded
    testbed): time a preempted job does not have within Slurm's GraceTime.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    if standby.standby_dir(os.environ) is not None:  # a warm standby: it holds the stop signals once told to go
        pause_gc()
        exit_now(standby.main(lambda: main(sys.argv[1:]), exit_now))
    hold_stop_signals()  # first: until the trainer's handler is armed, a stop signal waits instead of killing
    pause_gc()  # before the imports: the trainer resumes it once the model is built
    exit_now(main(sys.argv[1:]))
