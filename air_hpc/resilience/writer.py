"""The forked writer of an async checkpoint save: start it, hear its report, stop it, and never outlive its rank.

The :class:`~air_hpc.resilience.checkpointer.Checkpointer` decides when to save and what a report
means; this module owns the process: how it is forked, what it does, how it reports (the write
results through a pipe), how it is stopped (with the workers Megatron forks from it), and how it
dies with its rank.

A writer dies with its rank: it watches a pipe whose only write end the rank holds, and kills
its own process group (itself and the workers Megatron forks from it) when that end closes,
which the kernel does however the rank ends, ``kill -9`` included.
"""

import contextlib
import gc
import logging
import multiprocessing
import os
import queue
import signal
import threading
import time
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
    """One running writer as its rank holds it: the process, the pipe it reports on, the rank's lifeline end."""

    def __init__(self, process: Any, conn: Connection, alive_fd: int) -> None:
        self.process = process
        self.conn = conn
        self.alive_fd: int | None = alive_fd
        """The rank's end of the pipe the writer watches; closing it (or dying) stops the writer."""

    @classmethod
    def start(cls, fmt: ShardWriter, request: Any, staging: Path, rank: int) -> "Writer":
        """Fork the writer of ``request``'s shards into ``staging``."""
        ctx = multiprocessing.get_context("fork")
        conn, child_end = ctx.Pipe(duplex=False)
        alive = os.pipe()
        process = ctx.Process(target=_run, args=(fmt, request, staging, rank, child_end, alive), daemon=False)
        process.start()
        _lead_own_process_group(cast(int, process.pid))  # a started process has one
        child_end.close()
        os.close(alive[0])
        return cls(process, conn, alive[1])

    @property
    def pid(self) -> int:
        return cast(int, self.process.pid)

    @property
    def exitcode(self) -> int | None:
        return cast("int | None", self.process.exitcode)

    def is_alive(self) -> bool:
        return bool(self.process.is_alive())

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
        self.process.join()
        self._release()
        if self.process.exitcode != 0 and error is None:
            error = f"the background writer exited with {self.process.exitcode}"
        return cast("str | None", error)

    def stop(self) -> None:
        """SIGKILL the writer and every worker it forked (its process group), reap it, close the pipes."""
        with contextlib.suppress(ProcessLookupError):  # the whole group exited already
            os.killpg(self.pid, signal.SIGKILL)
        self.process.join()
        self.conn.close()
        self._release()

    def _release(self) -> None:
        """Close the rank's end of the lifeline pipe (the writer has exited or been killed)."""
        if self.alive_fd is not None:
            os.close(self.alive_fd)
            self.alive_fd = None


def _die_with_rank(alive_fd: int) -> None:
    """In the writer: kill our process group as soon as the rank's end of the lifeline pipe closes.

    The rank holds the only write end; the kernel closes it when the rank exits, however it
    exits. ``PR_SET_PDEATHSIG`` would reach this process only, not the workers it forks.
    """

    def watch() -> None:
        while os.read(alive_fd, 64):
            pass
        os.killpg(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="writer-lifeline", daemon=True).start()


def _run(fmt: ShardWriter, request: Any, staging: Path, rank: int, conn: Connection, alive: tuple[int, int]) -> None:
    """The forked writer of an async save: write, hash, send the write results to the rank, exit.

    Runs at a lower CPU priority so that on a busy node the training ranks keep their cores, and
    without garbage collection.
    It inherits the rank's signal handlers, which only set a flag: a preemption signal sent to
    every process of the job step does not kill a write in progress. It leads its own process
    group, so that a superseded write can be stopped with the worker processes Megatron forks
    from it: an orphaned worker would keep the rank's inherited sockets (rank 0's rendezvous
    port among them) open, and the next start's ranks would connect to a listener nobody serves.
    Slurm's ``proctrack/cgroup`` and ``proctrack/linuxproc`` still count it in the step;
    ``proctrack/pgid`` (which Slurm advises against) would not.

    It sends ``(results, None)``, or ``(None, error)`` with :func:`describe_error`'s line.
    """
    _lead_own_process_group(os.getpid())
    os.close(alive[1])  # only the rank may hold the write end, or its death would go unnoticed
    _die_with_rank(alive[0])
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


def _lead_own_process_group(pid: int) -> None:
    """Called by both the writer and the rank, so the group exists before either goes on."""
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the writer exited already
        os.setpgid(pid, pid)
