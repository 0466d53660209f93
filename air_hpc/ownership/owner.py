"""One live owner per run directory: a lock taken at submit, a fence checked at rank start.

Two jobs on one run directory interleave their metrics, events and logs and race on the
checkpoints. ``owner.json`` names the job that owns the run; :func:`claim` (submit) replaces it
only while holding ``.owner.lock`` (``flock``) and only when the job it names has ended, and
:func:`fence` (every rank, before it writes anything) stops a rank whose job is not the owner.
The rank takes the lock shared, so a job that starts while its own submit is still recording
it waits for that record instead of finding the previous owner.

This is the one place a submit is refused for a live job: a job the run's records know but
the owner file does not (an ``sbatch`` whose answer was lost, found later by its comment:
:mod:`air_hpc.ownership.attempts`) is first made the owner (:func:`adopt`), then checked like any owner.
"""

import contextlib
import fcntl
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

from air_hpc.digits import ascii_int
from air_hpc.errors import AirHpcError, UserError
from air_hpc.exitcodes import ExitCode
from air_hpc.ownership.local_job import ProcessIdentity
from air_hpc.records.files import atomic_write, open_fd
from air_hpc.records.rundir import RunDir
from air_hpc.slurm.env import SlurmEnv

log = logging.getLogger(__name__)


class RunBusyError(UserError):
    """Another live job owns the run directory."""


class NotOwnerError(AirHpcError):
    """This job is not the run directory's owner: its ranks must not write there (nor is it requeued)."""

    exit_code = ExitCode.USAGE


@dataclass(frozen=True)
class Owner:
    job_id: str
    executor: str
    time_s: float
    pid_start_s: float | None = None
    """Local executor: the start time of the controller process whose PID is the job id."""
    chain: tuple[str, ...] = ()
    """``submit --chain``: every link's job id, in order; each becomes the owner when it starts (one at a time)."""

    def later_links(self) -> tuple[str, ...]:
        """The chain's links after the owner (all but the first when the owner is not a link)."""
        if self.job_id in self.chain:
            return self.chain[self.chain.index(self.job_id) + 1 :]
        return self.chain[1:]

    def local_process_alive(self) -> bool:
        """The local controller still runs: its PID exists and started when it did (not a reused PID)."""
        pid = ascii_int(self.job_id)
        if self.pid_start_s is None or pid is None:
            return False
        return ProcessIdentity(pid, self.pid_start_s).process() is not None


def read_owner(run_dir: RunDir) -> Owner | None:
    """The recorded owner, or None (never claimed); an unreadable record is an error naming the file."""
    try:
        data = json.loads(run_dir.owner.read_text())
        return Owner(
            job_id=str(data["job_id"]),
            executor=str(data["executor"]),
            time_s=float(data["time_s"]),
            pid_start_s=None if data.get("pid_start_s") is None else float(data["pid_start_s"]),
            chain=tuple(str(j) for j in data.get("chain") or ()),
        )
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(
            f"{run_dir.owner}: unreadable owner record ({exc}); delete it if no job of this run is running"
        ) from None


@contextlib.contextmanager
def _locked(run_dir: RunDir, exclusive: bool) -> Iterator[None]:
    run_dir.path.mkdir(parents=True, exist_ok=True)
    fd = open_fd(run_dir.owner_lock, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


class RecordOwner(Protocol):
    """What :func:`claim` yields: record the submitted job as the owner (a local job with its controller; a chain)."""

    def __call__(
        self, job_id: str, executor: str, process: ProcessIdentity | None = None, chain: Sequence[str] = ()
    ) -> Owner: ...


def _write(run_dir: RunDir, owner: Owner) -> None:
    atomic_write(run_dir.owner, json.dumps(asdict(owner)) + "\n")


def _succeed(run_dir: RunDir, found: Sequence[Owner]) -> None:
    """The lock held: each found job newer than the recorded owner becomes the owner, oldest first."""
    current = read_owner(run_dir)
    for owner in sorted(found, key=lambda o: o.time_s):
        if current is None or (owner.job_id != current.job_id and owner.time_s > current.time_s):
            log.warning("%s: job %s owns the run (recorded, but never made its owner)", run_dir.path, owner.job_id)
            _write(run_dir, owner)
            current = owner


def adopt(run_dir: RunDir, find: Callable[[], Sequence[Owner]]) -> None:
    """Under the run's lock, make the jobs ``find`` returns the owner where they are newer than it (status, cancel)."""
    with _locked(run_dir, exclusive=True):
        _succeed(run_dir, find())


@contextlib.contextmanager
def claim(
    run_dir: RunDir, is_live: Callable[[Owner], bool], find: Callable[[], Sequence[Owner]] = tuple
) -> Iterator[RecordOwner]:
    """Hold the run's lock while submitting; refuse if a live job owns it; yields ``record(job_id, executor, process)``.

    ``find`` runs first, under the lock: the jobs the run's records know that may be newer than
    the owner file (see :func:`adopt`). ``is_live`` decides whether the owner still runs (Slurm:
    not in a final state; local: its controller process). An ended owner's claim is stale and simply
    taken over. ``process`` is a local job's controller, as recorded in submissions.jsonl.
    """
    with _locked(run_dir, exclusive=True):
        _succeed(run_dir, find())
        current = read_owner(run_dir)
        if current is not None and is_live(current):
            raise RunBusyError(
                f"{run_dir.path}: job {current.job_id} ({current.executor}) still owns this run directory; "
                f"wait for it to end or cancel it (air-hpc cancel {run_dir.path}) before submitting again"
            )
        if current is not None:
            log.info("taking over %s from job %s, which has ended", run_dir.path, current.job_id)

        def record(
            job_id: str, executor: str, process: ProcessIdentity | None = None, chain: Sequence[str] = ()
        ) -> Owner:
            owner = Owner(job_id, executor, time.time(), None if process is None else process.started_s, tuple(chain))
            _write(run_dir, owner)
            return owner

        yield record


def advance_chain(run_dir: RunDir, job_id: str) -> Owner | None:
    """A chain's next link takes over from the link before it as it starts; the new owner, else None (no change).

    Slurm runs one link at a time (``--dependency=singleton``), so the link that starts is the only live one.
    """
    with _locked(run_dir, exclusive=True):
        owner = read_owner(run_dir)
        if owner is None or owner.job_id == job_id or job_id not in owner.chain:
            return None
        successor = Owner(job_id, owner.executor, time.time(), None, owner.chain)
        _write(run_dir, successor)
        log.info("%s: chain link %s takes over from %s", run_dir.path, job_id, owner.job_id)
        return successor


def fence(run_dir: RunDir, environ: Mapping[str, str]) -> None:
    """Raise :class:`NotOwnerError` unless this process's job owns ``run_dir`` (or it was never claimed)."""
    job_id = environ.get("SUBMITIT_LOCAL_JOB_ID") or SlurmEnv.from_environ(environ).run_job_id  # local first
    with _locked(run_dir, exclusive=False):
        owner = read_owner(run_dir)
    if owner is None or job_id is None or owner.job_id == job_id:
        return
    raise NotOwnerError(
        f"{run_dir.path} belongs to job {owner.job_id}, not to this job {job_id}: "
        "exiting before writing anything (submit it under its own run.name)"
    )
