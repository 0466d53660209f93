"""Sync and async checkpoint saves and the resume at start, as the training loop drives them.

All methods are collective: every rank calls them at the same step.

Save: rank 0 clears leftovers of interrupted saves; the ranks plan together (Megatron
``dist_checkpointing``, which also writes ``common.pt``); each rank writes its shards, fsyncs
them and records their sha256 (``.sha256-rank<R>.json``) while they are in its page cache;
the ranks finalize together (``.metadata``); rank 0 commits: manifest last, rename, ``latest``.

- ``sync=True`` (preemption, final): all of that before returning, on every rank: an early
  exit of one rank would let ``srun --kill-on-bad-exit`` kill the one still committing.
- async: GPU tensors are copied to host memory (on the CPU the ``fork`` gives a copy-on-write
  snapshot) and a forked writer per rank writes and hashes in the background, at a lower CPU
  priority; it sends Megatron's write results back through a pipe. :meth:`Checkpointer.poll`
  (every step) agrees with one all-reduce whether all writers have reported, then finalizes;
  rank 0 commits in a background thread. ``latest`` moves only after the data is durable, and
  a new save first waits for the previous one, at most ``async_wait_s``: writers that have not
  reported by then on some rank are killed on every rank and that save is abandoned (a
  ``checkpoint_failed`` event; the newest complete checkpoint stays the one to resume from).

A save that fails (a full disk, a read-only file system, a writer that died) emits a
``checkpoint_failed`` event, removes its staging directory, and raises one
:class:`CheckpointError` naming the path and the errno.

The writer processes (fork, report, stop, dying with the rank) are :mod:`air_hpc.resilience.writer`'s;
what a checkpoint holds is one :class:`~air_hpc.resilience.training_state.TrainingState`.

Retention (deleting old checkpoints) runs in rank 0's background thread after each commit and
deletes only checkpoints superseded by a newer one this process verified (resumed from after
hashing it, or wrote and hashed itself).
Resume: rank 0 lists the committed steps; every rank checks all sizes and hashes its share of
the files of the newest one, and rank 0 runs the safe loader's checks on it; the first that passes
everywhere is loaded on all ranks. When checkpoints exist but none passes, the run refuses to start
(:class:`UnusableCheckpointsError`) unless ``checkpoint.allow_fresh_start`` is set.
"""

import logging
import queue
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from air_hpc.backend.collectives import Collectives, ProcessGroup
from air_hpc.config.layout import ParallelLayout
from air_hpc.errors import CheckpointError, UnusableCheckpointsError
from air_hpc.records.events import (
    CheckpointFailed,
    CheckpointPartial,
    CheckpointSaved,
    CheckpointSkipped,
    EventLog,
    FreshStart,
    Payload,
    Resume,
)
from air_hpc.resilience import state
from air_hpc.resilience.failures import describe_error, file_system_problem, os_error_in
from air_hpc.resilience.store import Check, CheckpointStore, step_name
from air_hpc.resilience.training_state import TrainingState
from air_hpc.resilience.writer import Writer, write_and_hash

log = logging.getLogger(__name__)


class CheckpointFormat(Protocol):
    """What the checkpointer needs of a checkpoint format; :class:`state.DistCheckpoint` is Megatron's.

    A save is planned by every rank together (``plan`` returns this rank's request), written by
    each rank alone (``write``, possibly in a forked writer after ``stage``), and finalized by
    every rank together (``finalize``, after the write results were put on ``results_queue``).
    """

    def plan(self, directory: Path, step: int, training: TrainingState, validate: bool) -> Any: ...

    def stage(self, request: Any) -> Any: ...

    def writes(self, request: Any) -> bool:
        """This rank has something to write for ``request`` (else no writer is started)."""
        ...

    def write(self, request: Any, stage_to_host: bool, results: Any) -> None: ...

    def shard_files(self, request: Any) -> list[Path]: ...

    def results_queue(self) -> "queue.Queue[Any]": ...

    def finalize(self, request: Any) -> None: ...

    def check(self, directory: Path) -> None:
        """Raise :class:`CheckpointError` if loading ``directory`` would run anything it holds."""
        ...

    def load(self, directory: Path, training: TrainingState, reseed: Callable[[int], None] | None) -> state.Loaded: ...


@dataclass
class _Pending:
    step: int
    request: Any
    writer: Writer | None
    started_s: float
    stall_s: float
    reason: str
    phases: dict[str, float]
    error: str | None = None

    def lap(self, phase: str, since: float) -> float:
        now = time.perf_counter()
        self.phases[phase] = round(now - since, 4)
        return now

    def unreported(self, wait_s: float = 0.0) -> bool:
        """This rank's writer has not sent its results yet (it sends once, at its end), after ``wait_s``."""
        return self.writer is not None and not self.writer.reported(wait_s)

    def stop_writer(self) -> None:
        """Kill this rank's writer with the workers it forked."""
        if self.writer is not None:
            self.writer.stop()


#: How often a waiting save asks (collectively) whether the writers reported.
_WAIT_POLL_S = 0.5


class Checkpointer:
    """Saves and resumes one run's state through a :class:`CheckpointStore`."""

    def __init__(
        self,
        store: CheckpointStore,
        events: EventLog | None,
        async_save: bool,
        *,
        layout: ParallelLayout,
        checkpoint_format: CheckpointFormat | None = None,
        collectives: Collectives | None = None,
        device: str = "cpu",
        verify: Check = "sha256",
        async_blocker: str | None = None,
        async_wait_s: float = 600.0,
        allow_fresh_start: bool = False,
        progress: Callable[[], None] | None = None,
    ) -> None:
        """``layout``: this run's TP/PP/DP layout, saved with each checkpoint and compared on resume.

        ``checkpoint_format`` (default: Megatron's ``dist_checkpointing`` in ``layout``) and
        ``collectives`` (default: the default process group) are parameters so that unit tests
        can drive the save/wait/abandon logic with fakes.
        ``async_blocker``: why async saving cannot be used here (then every save is synchronous).

        ``async_wait_s``: the longest a save (or :meth:`wait`) waits for the previous async save's writers.
        ``allow_fresh_start``: start from scratch when checkpoints exist but none is usable.
        ``progress``: called after each round of waiting in which every rank answered (the heartbeat: a slow
        writer is :attr:`async_wait_s`'s to judge, a frozen rank stops the rounds and its watchdog's to judge).
        """
        self.store = store
        self.events = events
        self.format: CheckpointFormat = checkpoint_format or state.DistCheckpoint(layout)
        self.comm: Collectives = collectives or ProcessGroup()
        self.device = device
        self.verify = verify
        self.rank = self.comm.rank
        self.async_save = async_save and async_blocker is None
        self.async_wait_s = async_wait_s
        self.allow_fresh_start = allow_fresh_start
        self._progress = progress
        self._trusted: set[int] = set()
        self._pending: _Pending | None = None
        self._results = self.format.results_queue()
        self._validated = False
        self._commit: threading.Thread | None = None
        self._commit_error: BaseException | None = None
        if async_save and async_blocker is not None:
            log.warning("async checkpoint saves are off: %s; every save blocks training", async_blocker)
        elif self.rank == 0:
            log.info("checkpoint saves: %s", "async (forked writer per rank)" if self.async_save else "synchronous")

    # -- saving -------------------------------------------------------------------------------
    def save(
        self,
        step: int,
        training: TrainingState,
        *,
        sync: bool = False,
        reason: str = "interval",
        supersede: bool = False,
    ) -> None:
        """Save ``training`` as ``step``; async unless ``sync`` or async is off. Returns when training may continue.

        ``supersede`` (a preemption's save, due within the signal's lead time) does not wait for an
        async save still being written: its writers are stopped and the older step is left partial.
        Any other save waits for the previous one.
        """
        if supersede:
            self._abandon_unfinished_write(step)
        self.wait()
        try:
            self._save(step, training, sync=sync, reason=reason)
        except CheckpointError:
            raise
        except Exception as exc:
            staging = self._staging_path(step)
            if os_error_in(exc) is None and file_system_problem(staging) is None:
                raise
            self._fail(step, describe_error(exc, staging), exc)  # a full or read-only disk: say the path and errno

    def _save(self, step: int, training: TrainingState, *, sync: bool, reason: str) -> None:
        started = time.perf_counter()
        state.drain(self._results)
        pending = _Pending(step, None, None, started, 0.0, reason, {})
        error = None
        if self.rank == 0:
            try:
                self.store.begin(step)
            except OSError as exc:
                error = describe_error(exc, self._staging_path(step))
        if self.comm.any_rank(error is not None):  # also the barrier before the ranks write into the staging directory
            self._fail(step, error or "on rank 0")
        staging = self.store.staging_dir(step)
        lap = pending.lap("begin", started)
        pending.request = self.format.plan(staging, step, training, validate=not self._validated)
        self._validated = True
        lap = pending.lap("plan", lap)
        if sync or not self.async_save:
            try:
                hash_s = write_and_hash(
                    self.format, pending.request, staging, self.rank, self.device == "cuda", self._results
                )
                pending.phases["hash"] = round(hash_s, 4)
            except Exception as exc:
                log.exception("writing the shards of step %d failed", step)
                pending.error = describe_error(exc, staging)
            pending.lap("write", lap)
            self._finish(pending, sync=True)
            self.comm.barrier()
            return
        request = pending.request
        if self.device == "cuda":
            request = self.format.stage(request)
            lap = pending.lap("stage", lap)
        if self.format.writes(request):
            pending.writer = Writer.start(self.format, request, staging, self.rank)
            pending.lap("fork", lap)
        pending.stall_s = time.perf_counter() - started
        self._pending = pending

    @property
    def writing(self) -> bool:
        """An async save is in flight and not yet finalized (the same answer on every rank)."""
        return self._pending is not None

    @property
    def busy(self) -> bool:
        """Writing, or (rank 0) committing in the background; differs across ranks, unlike :attr:`writing`."""
        return self._pending is not None or (self._commit is not None and self._commit.is_alive())

    def poll(self) -> bool:
        """Call once per step on every rank: finalizes an async save whose writers all finished."""
        pending = self._pending
        if pending is None:
            return False
        if self.comm.any_rank(pending.unreported()):
            return False
        self._pending = None
        self._finish(pending, sync=False)
        return True

    def _abandon_unfinished_write(self, superseded_by: int) -> None:
        """Stop an async save that any rank is still writing (all ranks agree), keeping one already written."""
        pending = self._pending
        if pending is None:
            return
        if not self.comm.any_rank(pending.unreported()):
            return
        self._pending = None
        pending.stop_writer()
        log.warning("step %d: the async save of step %d is superseded before it finished", superseded_by, pending.step)
        if self.rank == 0:
            self._emit(CheckpointSkipped(step=pending.step, why=f"superseded by the save of step {superseded_by}"))

    def wait(self) -> None:
        """Block until the in-flight save (if any) is durable and committed."""
        pending = self._pending
        if pending is not None:
            self._pending = None
            if self._writers_reported(pending):
                self._finish(pending, sync=False)
        if self._commit is not None:
            self._commit.join()
            self._commit = None
        if self._commit_error is not None:
            error, self._commit_error = self._commit_error, None
            raise CheckpointError(f"committing the previous checkpoint failed: {describe_error(error)}") from error

    def _writers_reported(self, pending: _Pending) -> bool:
        """Wait until every rank's writer reported; past ``async_wait_s`` on any rank, abandon the save.

        A forked writer that never reports (seen once: it hung before writing a byte) would
        otherwise block this save until the watchdog ends the job.
        """
        waited_from = time.monotonic()
        while self.comm.any_rank(pending.unreported(_WAIT_POLL_S)):
            if self._progress is not None:
                self._progress()
            if not self.comm.any_rank(time.monotonic() - waited_from > self.async_wait_s):
                continue
            pending.stop_writer()
            why = f"the background writers did not finish within {self.async_wait_s:g} s; the save is abandoned"
            log.error("step %d: %s", pending.step, why)
            if self.rank == 0:
                self._emit(CheckpointFailed(step=pending.step, why=why))
            return False
        return True

    def close(self) -> None:
        """Collective: wait for the in-flight save to be durable and committed."""
        self.wait()

    def abort(self) -> None:
        """After an error on this rank: stop its writer and let rank 0's commit end, without a collective.

        The other ranks may have failed too or be inside another collective, so nothing here
        waits for them; an unfinished save stays partial and the newest complete one counts.
        """
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.stop_writer()
            log.warning("step %d: the async save is abandoned after an error", pending.step)
        if self._commit is not None:
            self._commit.join()
            self._commit = None

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        """:meth:`close` after a normal exit, :meth:`abort` after an exception."""
        if kind is None:
            self.close()
        else:
            self.abort()

    def _finish(self, pending: _Pending, sync: bool) -> None:
        if pending.writer is not None:
            pending.error = pending.writer.collect(self._results)
        if self.comm.any_rank(pending.error is not None):
            self._fail(pending.step, pending.error or "on another rank")
        lap = time.perf_counter()
        self.format.finalize(pending.request)
        pending.lap("finalize", lap)
        if self.rank != 0:
            return
        if sync:
            self._commit_and_report(pending, sync=True)
        self._commit = threading.Thread(
            target=self._in_background, args=(pending, not sync), name="checkpoint-commit", daemon=False
        )
        self._commit.start()

    def _fail(self, step: int, why: str, cause: BaseException | None = None) -> None:
        """A save failed (the ranks agreed, or rank 0 alone): event and cleanup on rank 0, then one error."""
        log.error("saving step %d failed: %s", step, why)
        if self.rank == 0:
            self._discard(step, why)
        raise CheckpointError(f"saving step {step} failed: {why}") from cause

    def _discard(self, step: int, why: str) -> None:
        """Rank 0: a ``checkpoint_failed`` event, and the failed save's staging directory removed."""
        self._emit(CheckpointFailed(step=step, why=why))
        staging = self._staging_path(step)
        shutil.rmtree(staging, ignore_errors=True)
        if staging.exists():
            log.warning("could not remove the partial checkpoint %s", staging)

    def _staging_path(self, step: int) -> Path:
        return self.store.root / f".tmp-{step_name(step)}"

    def _in_background(self, pending: _Pending, commit: bool) -> None:
        """Rank 0: commit an async save, then apply retention (deleting old checkpoints takes a while)."""
        if commit:
            try:
                self._commit_and_report(pending, sync=False)
            except BaseException as exc:
                log.exception("committing step %d failed", pending.step)
                self._discard(pending.step, describe_error(exc, self._staging_path(pending.step)))
                self._commit_error = exc
                return
        try:
            self.store.apply_retention(trusted=set(self._trusted))
        except BaseException as exc:
            log.exception("applying retention after step %d failed", pending.step)
            self._commit_error = exc

    def _commit_and_report(self, pending: _Pending, sync: bool) -> None:
        lap = time.perf_counter()
        path = self.store.commit(pending.step, retain=False)
        self._trusted.add(pending.step)  # hashed by the ranks that wrote it
        pending.lap("commit", lap)
        manifest = self.store.verify(pending.step, check="size")
        seconds = time.perf_counter() - pending.started_s
        self._emit(
            CheckpointSaved(
                step=pending.step,
                bytes=manifest.bytes,
                seconds=round(seconds, 4),
                stall_s=round(seconds if sync else pending.stall_s, 4),
                path=str(path),
                reason=pending.reason,
                phases=pending.phases,
                async_=not sync,
            )
        )
        log.info("saved step %d (%s): %s", pending.step, "sync" if sync else "async", pending.phases)

    def _emit(self, payload: Payload) -> None:
        if self.events is not None:
            self.events.emit(payload)

    # -- resuming -----------------------------------------------------------------------------
    def find_resume_step(self) -> int | None:
        """The newest checkpoint that verifies, the same on every rank; None on the first start.

        Rank 0 lists the candidates (one broadcast); for each, newest first, every rank checks all
        sizes and hashes its share of the files (``checkpoint.verify: sha256``), so reading the
        checkpoint back is spread over the ranks and nodes; one all-gather collects the verdicts.
        """
        rank, world = self.rank, self.comm.world_size
        listing: list[int] | None = None
        if rank == 0:
            for path in self.store.partial():
                log.warning("ignoring %s: a save that did not finish", path)
                self._emit(CheckpointPartial(path=str(path), why="save did not finish; ignored"))
            listing = sorted(self.store.committed_steps(), reverse=True)
        failures: list[str] = []
        for step in self.comm.broadcast_from_0(listing):
            problem = None
            try:
                self.store.verify(step, check=self.verify, share=(rank, world))
                if rank == 0:
                    self.format.check(self.store.path(step))  # a planted pickle: refused like a corrupt file
            except CheckpointError as exc:
                problem = str(exc)
            found = [p for p in self.comm.gather(problem) if p]
            if not found:
                self._trusted.add(int(step))
                return int(step)
            if rank == 0:
                log.warning("skipping checkpoint step %d: %s", step, found[0])
                self._emit(CheckpointSkipped(step=step, why=found[0]))
            failures.append(found[0])
        if failures and not self.allow_fresh_start:
            raise UnusableCheckpointsError(
                f"{self.store.root}: all {len(failures)} checkpoint(s) failed verification "
                f"({'; '.join(failures)}); refusing to start from scratch over them (they are kept). "
                "To train from step 0 anyway, set checkpoint.allow_fresh_start=true "
                "(air-hpc submit JOB --set checkpoint.allow_fresh_start=true)"
            )
        if failures and rank == 0:
            log.warning("no usable checkpoint; starting from scratch (checkpoint.allow_fresh_start)")
            self._emit(FreshStart(skipped=len(failures)))
        return None

    def resume(self, training: TrainingState, reseed: Callable[[int], None] | None = None) -> state.Loaded | None:
        """Load the newest good checkpoint into ``training``; None on the first start (resume is the normal start)."""
        step = self.find_resume_step()
        if step is None:
            if self.rank == 0:
                log.info("no checkpoint to resume from in %s: starting from scratch", self.store.root)
            return None
        started = time.perf_counter()
        loaded = self.format.load(self.store.path(step), training, reseed)
        if self.rank == 0:
            self._emit(
                Resume(
                    step=loaded.step,
                    seconds=round(time.perf_counter() - started, 4),
                    layout_changed=loaded.layout_changed,
                    rng_restored=loaded.rng_restored,
                    saved_layout=str(loaded.saved_layout),
                )
            )
        return loaded
