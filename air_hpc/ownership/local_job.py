"""A LocalExecutor job, followed through the run's own JSON records: never its pickles, never a bare PID.

submitit's LocalExecutor runs a controller process on this machine whose PID is
the job id. ``submit`` records that PID with the process's start time, each
rank records its exit code (``ended`` lines in submissions.jsonl) and ``cancel``
records itself, so the state is read from JSON alone: submitit's
``*_result.pkl`` would run whatever code a planted pickle names. A PID whose
start time differs from the recorded one now belongs to another process and is
never signalled.
"""

import contextlib
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from air_hpc.errors import AirHpcError, UserError
from air_hpc.exitcodes import ExitCode
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import SubmissionRecord, record_exit
from air_hpc.slurm.jobs import JobState, JobStatus

log = logging.getLogger(__name__)

#: psutil derives start times from clock ticks since boot; the same process always reads the same value.
START_TIME_TOLERANCE_S = 0.05
#: The module submitit's controller runs as (``python -m submitit.local._local FOLDER``).
CONTROLLER_MODULE = "submitit.local._local"


@dataclass(frozen=True)
class ProcessIdentity:
    """A process named by PID and start time: together they cannot be reused by another process."""

    pid: int
    started_s: float

    @classmethod
    def of(cls, pid: int) -> "ProcessIdentity":
        return cls(pid, psutil.Process(pid).create_time())

    def process(self) -> psutil.Process | None:
        """The live process, or None when it ended or its PID now belongs to another process."""
        try:
            proc = psutil.Process(self.pid)
            if abs(proc.create_time() - self.started_s) > START_TIME_TOLERANCE_S:
                return None
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            return proc
        except psutil.Error:
            return None


class RecordExit:
    """What the LocalExecutor runs on each rank: the entry, then an ``ended`` line with the rank's exit code.

    Picklable (submitit ships it to the ranks) and checkpointable like the
    entry it wraps, so a requeued start records its exit too.
    """

    def __init__(self, entry: Callable[[], Any], run_dir: Path) -> None:
        self.entry = entry
        self.run_dir = run_dir

    def __call__(self) -> Any:
        import submitit

        env = submitit.JobEnvironment()
        code: int = ExitCode.FAILURE
        try:
            result = self.entry()
            code = int(getattr(result, "exit_code", ExitCode.OK))
            return result
        except AirHpcError as exc:
            code = int(exc.exit_code)
            raise
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else ExitCode.FAILURE
            raise
        finally:
            record_exit(RunDir(self.run_dir), str(env.job_id), env.global_rank, code)

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """The entry's own requeue (submitit's ``Checkpointable`` protocol), still recording exits."""
        import submitit

        inner = getattr(self.entry, "checkpoint", None)
        delayed = inner(*args, **kwargs) if inner is not None else None
        if delayed is None:
            return None
        wrapped = RecordExit(delayed.function, self.run_dir)
        return submitit.helpers.DelayedSubmission(wrapped, *delayed.args, **delayed.kwargs)


def controller(record: SubmissionRecord) -> psutil.Process | None:
    """The job's live controller process, only when the recorded PID and start time both match."""
    if record.pid is None or record.pid_started_s is None:
        return None
    return ProcessIdentity(record.pid, record.pid_started_s).process()


def _world_size(run_dir: RunDir, recorded: int) -> int:
    try:
        return run_dir.read_job().resources.world_size
    except AirHpcError:
        return max(recorded, 1)


def local_job_status(run_dir: RunDir, record: SubmissionRecord) -> JobStatus:
    """RUNNING while the proven controller lives; afterwards what the ranks and ``cancel`` recorded."""

    def status(state: JobState, reason: str = "", exit_code: int | None = None) -> JobStatus:
        return JobStatus(record.job_id, state, 1, "localhost", run_dir.path.name, 0, "local", reason, "", exit_code)

    if record.pid_started_s is None:
        return status(JobState.UNKNOWN, f"no start time recorded for PID {record.job_id}: cannot tell it is this run's")
    if controller(record) is not None:
        return status(JobState.RUNNING)
    if record.cancelled:
        return status(JobState.CANCELLED, "cancelled with air-hpc cancel")
    exits = record.exits
    if not exits:
        return status(JobState.FAILED, "the local job ended without any rank recording an exit code")
    failed = {rank: code for rank, code in exits.items() if code != ExitCode.OK}
    if failed:
        rank, code = max(failed.items(), key=lambda item: (item[1], -item[0]))
        return status(JobState.FAILED, f"rank {rank} exited {code}", code)
    world = _world_size(run_dir, len(exits))
    missing = sorted(set(range(world)) - set(exits))
    if missing:
        return status(JobState.FAILED, f"rank(s) {', '.join(map(str, missing))} recorded no exit code")
    return status(JobState.COMPLETED, exit_code=0)


#: Seconds a local job's processes get to stop after cancel's first signal, before each one left is killed.
CANCEL_GRACE_S = 10.0


@dataclass(frozen=True)
class LocalCancel:
    """What cancelling a local job ended: processes that stopped on the first signal, those killed after the grace."""

    stopped: int
    killed: int
    survivors: tuple[int, ...]
    """PIDs still alive even after SIGKILL (stuck in the kernel); empty when the whole job ended."""

    def describe(self, grace_s: float) -> str:
        said = f"{self.stopped} process(es) stopped"
        if self.killed:
            said += f", {self.killed} killed after ignoring the stop for {grace_s:g} s"
        if self.survivors:
            said += f"; still alive after SIGKILL: PID(s) {', '.join(map(str, self.survivors))}"
        return said


def cancel_local(record: SubmissionRecord, grace_s: float = CANCEL_GRACE_S) -> LocalCancel | None:
    """Stop the proven controller and every process under it; None when it had already ended.

    SIGINT to the controller (it then stops its tasks); a process still alive ``grace_s``
    later (a rank in submitit's bootstrap ignores SIGTERM) is killed. Every process is the
    one seen at the start (psutil checks PID and start time before signalling), so a PID
    reused meanwhile is never signalled.
    """
    if record.pid_started_s is None:
        raise UserError(
            f"local job {record.job_id}: no process start time recorded, so PID {record.job_id} cannot be proven "
            "to be this run's; not signalling it (stop the job by hand)"
        )
    proc = controller(record)
    if proc is None:
        return None
    family = [proc, *_descendants(proc)]
    _first_signal(proc)
    gone, alive = _wait_gone(family, grace_s)
    stragglers = {p.pid: p for p in alive}
    for p in alive:
        stragglers.update((child.pid, child) for child in _descendants(p))
    for p in stragglers.values():
        log.warning("cancel: PID %d (%s) still running %g s after the stop; killing it", p.pid, p.name(), grace_s)
        with contextlib.suppress(psutil.Error):  # ended meanwhile, or its PID is another process's now
            p.kill()
    _, left = _wait_gone(list(stragglers.values()), 5.0)
    return LocalCancel(len(gone), len(stragglers) - len(left), tuple(p.pid for p in left))


def _ended(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _wait_gone(procs: list[psutil.Process], timeout_s: float) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """The processes that ended within ``timeout_s`` and those still running; reaps none (a caller's child stays
    its own to wait for)."""
    deadline = time.monotonic() + timeout_s
    while not all(_ended(p) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = [p for p in procs if not _ended(p)]
    return [p for p in procs if p not in alive], alive


def _descendants(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return list(proc.children(recursive=True))
    except psutil.Error:
        return []


def _first_signal(proc: psutil.Process) -> None:
    """SIGINT to the controller (SIGTERM where it ignores SIGINT); with a setup, to the controller under its shell.

    With a setup the recorded process is the ``sh -c`` that runs submitit's
    controller: the controller itself (a child naming ``submitit.local._local``)
    gets the signal, since a shell interrupted while waiting would leave it running.
    """
    try:
        targets = [p for p in proc.children() if CONTROLLER_MODULE in " ".join(p.cmdline())] or [proc]
    except psutil.Error:
        targets = [proc]
    for target in targets:
        # Started where SIGINT was ignored (nohup, a background job of a script), it would ignore this one too;
        # the controller forwards SIGTERM to its tasks instead.
        signum = signal.SIGTERM if ignores(target.pid, signal.SIGINT) else signal.SIGINT
        with contextlib.suppress(psutil.Error):
            log.info("cancel: %s to local controller %d (%s)", signum.name, target.pid, " ".join(target.cmdline()))
            target.send_signal(signum)


def ignores(pid: int, signum: signal.Signals) -> bool:
    """Whether process ``pid`` ignores ``signum`` (the SigIgn mask of /proc/PID/status); False when unknown."""
    try:
        with open(f"/proc/{pid}/status") as status:
            mask = next((line.split()[1] for line in status if line.startswith("SigIgn:")), "0")
    except OSError:
        return False
    return bool(int(mask, 16) >> (signum - 1) & 1)
