"""Stopping cleanly: signal handlers that only set a flag, agreement across ranks, the deadline.

Saving inside a signal handler hangs or corrupts checkpoints (the handler can
run in the middle of a collective or a write). The handler here records the
signal and returns; the training loop checks the flag at a step boundary,
all ranks agree with one tiny all-reduce (a rank that got no signal still
stops with the others), and only then do they save together.
"""

import logging
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from air_hpc.backend import collectives
from air_hpc.digits import ascii_int
from air_hpc.errors import ConfigError
from air_hpc.records.files import touch
from air_hpc.records.names import ARMED_FILE_PREFIX, STOP_REQUESTED_FILE, SUBMISSIONS
from air_hpc.slurm.env import JOB_END_TIME, JOB_START_TIME, SlurmEnv, epoch_seconds

log = logging.getLogger(__name__)


def signal_number(name: str) -> signal.Signals:
    """``"USR2"``, ``"SIGUSR2"`` or ``"12"`` -> ``signal.SIGUSR2``."""
    text = name.strip().upper()
    number = ascii_int(text)
    if number is not None:
        try:
            return signal.Signals(number)
        except ValueError:
            pass
    else:
        full = text if text.startswith("SIG") else f"SIG{text}"
        if full in signal.Signals.__members__:
            return signal.Signals[full]
    raise ConfigError(f"resilience.signal: {name!r} is not a signal name (expected e.g. USR2 or TERM)")


#: Every signal that can stop a rank: the choices of ``resilience.signal`` and the trainer's SIGTERM.
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGURG)


def hold_stop_signals() -> None:
    """Block the stop signals from the first line of a rank until :meth:`StopRequest.install` handles them.

    The batch shell may forward a stop signal the moment the step starts; with the default
    action still in place it would kill the rank (the job ends FAILED) instead of asking it to
    checkpoint. A blocked signal stays pending and reaches the handler once it is installed.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


class StopRequest:
    """A flag set by signal handlers; read at step boundaries, never acted on inside the handler."""

    def __init__(self) -> None:
        self._signum: int | None = None
        self._received_at_s: float | None = None
        self._previous: dict[signal.Signals, Any] = {}

    @classmethod
    def install(cls, signal_names: Sequence[str]) -> "StopRequest":
        """Handle each named signal (main thread only), remembering the handlers it replaces."""
        request = cls()
        for name in dict.fromkeys(signal_number(n) for n in signal_names):
            request._previous[name] = signal.signal(name, request._handle)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # held since start: delivered now, if pending
        log.info("stop request armed for %s", ", ".join(s.name for s in request._previous))
        return request

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._signum is None:
            self._signum = signum
            self._received_at_s = time.time()

    def announce_armed(self, directory: Path, rank: int, signal_name: str) -> None:
        """Tell the batch shell this rank handles stop signals now, then take a stop it recorded before.

        The order is the protocol (see ``records.names.STOP_REQUESTED_FILE``): the shell records the stop
        before it counts armed ranks, a rank announces before it looks for the record, so either
        the shell forwards the signal or this rank (or a later one) finds the record.
        """
        directory.mkdir(parents=True, exist_ok=True)
        touch(directory / f"{ARMED_FILE_PREFIX}{rank}")
        if (directory / STOP_REQUESTED_FILE).exists():
            log.warning("rank %d: a stop was requested before this rank was armed", rank)
            self._handle(signal_number(signal_name), None)

    @property
    def requested(self) -> bool:
        return self._signum is not None

    @property
    def signal_name(self) -> str | None:
        """Name of the first signal received (``"SIGUSR2"``), or None."""
        return None if self._signum is None else signal.Signals(self._signum).name

    @property
    def received_at_s(self) -> float | None:
        """Wall-clock time of the first signal, for "seconds from signal to save" metrics."""
        return self._received_at_s

    def uninstall(self) -> None:
        """Put back the handlers that were there before :meth:`install`."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()


def agree(flag: bool, group: Any = None) -> bool:
    """True on every rank if ``flag`` is true on any rank: one MAX all-reduce of one int.

    Without an initialised process group (a single process) the flag is returned as is.
    """
    return collectives.any_rank(flag, group)


#: Stop reasons in the order they win when ranks disagree (the larger code wins the MAX).
STOP_REASONS = ("deadline", "signal")


def agree_stop(stop: "StopRequest", deadline: "Deadline", group: Any = None, now_s: float | None = None) -> str | None:
    """At a step boundary, on every rank: ``"signal"``, ``"deadline"`` or None, the same on all ranks.

    One MAX all-reduce: a signal on any rank stops everyone; clocks that differ slightly across
    nodes cannot split the decision.
    """
    code = collectives.max_int(2 if stop.requested else 1 if deadline.reached(now_s) else 0, group)
    return STOP_REASONS[code - 1] if code else None


#: The job's start time (epoch seconds) where Slurm (before 23.02) does not set ``SLURM_JOB_START_TIME``:
#: a launcher or a test sets it explicitly. Older Slurm versions use the batch script's ``started`` line.
LAUNCHER_START_VAR = "AIR_HPC_JOB_START_S"


@dataclass(frozen=True)
class Deadline:
    """When to stop and checkpoint even without a signal: the time limit minus a margin.

    Computed once at start from the job's start time and the configured limit, not by asking
    the controller (``squeue -o %e``) from inside the job: controller calls from every rank of
    a large job are exactly the load Slurm admins ask us to avoid.
    """

    stop_at_s: float | None
    source: str

    def remaining_s(self, now_s: float | None = None) -> float | None:
        if self.stop_at_s is None:
            return None
        return self.stop_at_s - (time.time() if now_s is None else now_s)

    def reached(self, now_s: float | None = None) -> bool:
        remaining = self.remaining_s(now_s)
        return remaining is not None and remaining <= 0

    @classmethod
    def none(cls) -> "Deadline":
        return cls(None, "none")

    @classmethod
    def from_env(
        cls,
        time_limit_min: int,
        margin_s: float,
        env: Mapping[str, str] | None = None,
        explicit_stop_at_s: float | None = None,
        now_s: float | None = None,
        submissions: Path | None = None,
    ) -> "Deadline":
        """The first that is known: an explicit stop time, the job's end time, its start time + limit.

        The start time comes from Slurm's environment, or from the ``started`` line our batch
        script appends to ``submissions`` (``RunDir.submissions``) for this job id. Falls back to
        ``now_s`` + limit (a late estimate: the job started before this process) and says so.
        """
        env = os.environ if env is None else env
        if explicit_stop_at_s is not None:
            return cls(explicit_stop_at_s, "explicit")
        slurm = SlurmEnv.from_environ(env)
        if slurm.job_end_time_s is not None:
            return cls(slurm.job_end_time_s - margin_s, JOB_END_TIME)
        limit_s = time_limit_min * 60.0
        starts = (
            (JOB_START_TIME, slurm.job_start_time_s),
            (LAUNCHER_START_VAR, epoch_seconds(env, LAUNCHER_START_VAR)),
        )
        for var, start in starts:
            if start is not None:
                return cls(start + limit_s - margin_s, var)
        from air_hpc.records.submissions import started_time  # pydantic: not before the signals are held

        start = started_time(submissions, slurm.job_id) if submissions else None
        if start is not None:
            return cls(start + limit_s - margin_s, SUBMISSIONS)
        now = time.time() if now_s is None else now_s
        log.warning(
            "job start time unknown (none of %s set): the deadline counts from this process's start",
            ", ".join((JOB_END_TIME, *(var for var, _ in starts))),
        )
        return cls(now + limit_s - margin_s, "process start")
