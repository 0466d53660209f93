"""The forked writer of an async checkpoint save: start it, hear its report, stop it, and never outlive its rank.

The :class:`~air_hpc.resilience.checkpointer.Checkpointer` decides when to save and what a report
means; this module owns the process: how it is forked, what it does, how it reports (the write
results through a pipe), how it is stopped (with the workers Megatron forks from it), and how it
dies with its rank.

A writer dies with its rank, however the rank ends (``kill -9`` included), and so does every
process the writer forks (Megatron's write workers): each asks the kernel, first thing after
the fork, for SIGKILL when its parent dies (``PR_SET_PDEATHSIG``), and exits at once if the
parent is already gone. Nothing in user space has to notice: an earlier design that watched a
pipe from a thread let a writer outlive its rank when another child of the rank held the pipe's
write end too, or when the writer hung before its thread started. The writer also lets go of
every network socket it inherited, so that it never holds rank 0's rendezvous port: a listener
kept open by a writer would make the next start fail to bind it.

The rank forks its writers from the thread that drives training, which lives as long as the rank
(the kernel sends the signal when the forking *thread* ends).
"""

import contextlib
import ctypes
import gc
import logging
import multiprocessing
import os
import queue
import signal
import socket
import stat
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol, cast

from air_hpc.resilience.failures import describe_error
from air_hpc.resilience.store import record_hashes

log = logging.getLogger(__name__)

#: How much lower the background writer's CPU priority is than the training process's.
_WRITER_NICENESS = 10


class ShardWriter(Protocol):
    """What writing one rank's shards needs of a checkpoint format (the checkpointer's format has it)."""

    def write(self, request: Any, stage_to_host: bool, results: Any) -> None: ...

    def shard_files(self, request: Any) -> list[Path]: ...


def write_and_hash(
    fmt: ShardWriter, request: Any, staging: Path, rank: int, stage_to_host: bool, results: Any
) -> float:
    """Write this rank's shards (write results go to ``results.put``) and record their sha256.

    Returns the seconds spent hashing. A write error that Megatron's writer reports as its
    result (a worker's ``OSError``, say) is raised here, before anything is hashed.
    """
    collected = _Collect()
    fmt.write(request, stage_to_host, collected)
    results.put(collected.item)
    if isinstance(collected.item, BaseException):
        raise collected.item
    started = time.perf_counter()
    record_hashes(staging, f"rank{rank}", fmt.shard_files(request))
    return time.perf_counter() - started


class _Collect:
    """Stands in for Megatron's results queue inside the forked writer: keeps the one result."""

    def __init__(self) -> None:
        self.item: Any = None

    def put(self, item: Any) -> None:
        self.item = item


class Writer:
    """One running writer as its rank holds it: the process (leading its own group) and the pipe it reports on."""

    def __init__(self, pid: int, conn: Connection) -> None:
        self.pid = pid
        self.conn = conn
        self.exitcode: int | None = None
        """Set once the writer is reaped: 0 after a report, 1 when it failed before, -N when killed by signal N."""

    @classmethod
    def start(cls, fmt: ShardWriter, request: Any, staging: Path, rank: int) -> "Writer":
        """Fork the writer of ``request``'s shards into ``staging``."""
        arm = _death_signal_setter()  # looked up here: the child calls it before anything else
        conn, child_end = multiprocessing.Pipe(duplex=False)
        rank_pid = os.getpid()
        pid = os.fork()
        if pid == 0:  # the writer; it never returns into the rank's code
            code = 1
            try:
                _die_with_parent(arm, rank_pid)
                conn.close()
                code = _run(fmt, request, staging, rank, child_end, arm)
            except BaseException:
                log.exception("rank %d: the background writer failed", rank)
            finally:
                os._exit(code)
        child_end.close()
        _lead_own_process_group(pid)
        return cls(pid, conn)

    def is_alive(self) -> bool:
        """Not yet exited (reaps it when it has)."""
        if self.exitcode is not None:
            return False
        return not self._reap(os.WNOHANG)

    def join(self) -> None:
        """Wait for the writer to exit and reap it."""
        if self.exitcode is None:
            self._reap(0)

    def _reap(self, flags: int) -> bool:
        try:
            pid, status = os.waitpid(self.pid, flags)
        except ChildProcessError:  # reaped elsewhere (never here): it is gone all the same
            self.exitcode = -1
            return True
        if pid == 0:
            return False
        self.exitcode = os.waitstatus_to_exitcode(status)
        return True

    def reported(self, wait_s: float = 0.0) -> bool:
        """The writer has sent its report (it sends once, at its end), waiting at most ``wait_s``."""
        return self.conn.poll(wait_s)

    def collect(self, results: "queue.Queue[Any]") -> str | None:
        """Wait for the report and the exit; put the write results on ``results``; the error, if any."""
        try:
            written, error = self.conn.recv()
            results.put(written)  # where Megatron's finalize looks for them
        except EOFError:
            error = "the background writer died before reporting"
        self.conn.close()
        self.join()
        if self.exitcode != 0 and error is None:
            error = f"the background writer exited with {self.exitcode}"
        return cast("str | None", error)

    def stop(self) -> None:
        """SIGKILL the writer and every worker it forked (its process group), reap it, close the pipe."""
        with contextlib.suppress(ProcessLookupError):  # the whole group exited already
            os.killpg(self.pid, signal.SIGKILL)
        self.join()
        self.conn.close()


#: ``prctl(2)`` option: the signal this process gets when its parent (thread) dies.
_PR_SET_PDEATHSIG = 1

_DeathSignalSetter = Callable[[int, int, int, int, int], int]


def _death_signal_setter() -> _DeathSignalSetter:
    """libc's ``prctl``, looked up in the rank: after a fork, the child only calls it."""
    libc = ctypes.CDLL(None, use_errno=True)
    return cast(_DeathSignalSetter, libc.prctl)


def _die_with_parent(arm: _DeathSignalSetter, parent_pid: int) -> None:
    """In a just-forked child: SIGKILL when the parent dies; exit now if it died before that was armed."""
    if arm(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    if os.getppid() != parent_pid:  # reparented: the parent is gone and the signal will never come
        os._exit(1)


class _ChildrenDieWithUs:
    """Fork hooks of a writer: whatever it forks (Megatron's write workers) arms its own death signal.

    ``before`` runs in the forking process, so the child knows which pid its parent is, at any depth.
    """

    def __init__(self, arm: _DeathSignalSetter) -> None:
        self.arm = arm
        self.parent = os.getpid()

    def before(self) -> None:
        self.parent = os.getpid()

    def after_in_child(self) -> None:
        _die_with_parent(self.arm, self.parent)


def _drop_network_sockets() -> None:
    """Point every inherited TCP/IP socket at ``/dev/null``: the writer never uses the network.

    Above all it must not keep rank 0's listening rendezvous port (the TCPStore) open. ``dup2``
    rather than ``close``, so that no descriptor number an inherited object still names is reused.
    """
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd != devnull and _is_network_socket(fd):
                os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _is_network_socket(fd: int) -> bool:
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            return False
        sock = socket.socket(fileno=fd)
    except OSError:  # the listing's own descriptor, closed by now
        return False
    try:
        return sock.family in (socket.AF_INET, socket.AF_INET6)
    finally:
        sock.detach()


def _run(fmt: ShardWriter, request: Any, staging: Path, rank: int, conn: Connection, arm: _DeathSignalSetter) -> int:
    """The forked writer of an async save: write, hash, send the write results to the rank; the exit code.

    Runs at a lower CPU priority so that on a busy node the training ranks keep their cores, and
    without garbage collection.
    It inherits the rank's signal handlers, which only set a flag: a preemption signal sent to
    every process of the job step does not kill a write in progress. It leads its own process
    group, so that a superseded write can be stopped with the worker processes Megatron forks
    from it. Slurm's ``proctrack/cgroup`` and ``proctrack/linuxproc`` still count it in the step;
    ``proctrack/pgid`` (which Slurm advises against) would not.

    It sends ``(results, None)``, or ``(None, error)`` with :func:`describe_error`'s line.
    """
    _lead_own_process_group(os.getpid())
    _drop_network_sockets()
    hooks = _ChildrenDieWithUs(arm)
    os.register_at_fork(before=hooks.before, after_in_child=hooks.after_in_child)
    gc.disable()  # a collection here could free the parent's CUDA tensors from a forked child (Megatron does the same)
    os.nice(_WRITER_NICENESS)
    collected = _Collect()
    try:
        write_and_hash(fmt, request, staging, rank, False, collected)
    except Exception as exc:
        log.exception("rank %d: the background writer failed", rank)
        conn.send((None, describe_error(exc, staging)))
    else:
        conn.send((collected.item, None))
    conn.close()
    return 0


def _lead_own_process_group(pid: int) -> None:
    """Called by both the writer and the rank, so the group exists before either goes on."""
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the writer exited already
        os.setpgid(pid, pid)
