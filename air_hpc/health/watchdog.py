"""The hang watchdog: a daemon thread per rank that ends a job which stopped making progress.

Why checking the rank's own heartbeat is enough to notice *any* rank hanging:
the ranks are coupled by collectives (gradient all-reduce, pipeline sends)
at least once per step, so when one rank stops, every other rank stops
within that step too, blocked waiting for it. Each watchdog therefore reads
only its own last beat from memory (no file access per poll, which would not
scale to thousands of ranks on a shared filesystem), and reads the other
ranks' files only once, to diagnose.

On a hang every rank's watchdog fires and:

1. dumps the Python stacks of all its threads (faulthandler) into its log;
2. writes a stall report: where its main thread is, and whether that is a
   wait for other ranks (inside ``torch.distributed`` or Megatron's p2p);
3. waits a grace period for the other ranks' reports, then names the
   suspects: ranks that are busy somewhere else, or that wrote no report at
   all (a process frozen in C code cannot run its watchdog);
4. the first rank to claim the start's verdict records the suspects' nodes in
   ``bad_nodes.txt`` and emits one ``hang`` event;
5. exits with ``ExitCode.HUNG`` through ``os._exit`` after flushing its logs:
   a hung collective never returns, so normal shutdown would hang too.
"""

import contextlib
import faulthandler
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Protocol, cast

import psutil

from air_hpc.config.models import HealthConfig
from air_hpc.exitcodes import ExitCode
from air_hpc.health.badnodes import append_bad_nodes
from air_hpc.health.heartbeat import Beat, Heartbeat, Phase, read_beats
from air_hpc.health.limits import LIMITED_PHASES, LimitedPhase, PhaseLimit
from air_hpc.records.events import EventLog, Hang
from air_hpc.records.files import atomic_write, open_append
from air_hpc.records.generation import write_exit_code

log = logging.getLogger(__name__)

#: A main thread whose innermost Python frame is in one of these is waiting for other ranks.
WAITING_MARKERS: tuple[str, ...] = (
    "torch/distributed/",
    "megatron/core/pipeline_parallel/p2p_communication",
    "megatron/core/distributed/",
)


class Limits(Protocol):
    """Each phase's limit and how it was derived: fixed (:class:`PhaseLimits`) or learned
    (:class:`~air_hpc.health.learning.LearnedLimits`)."""

    def limit(self, phase: str) -> PhaseLimit | None: ...

    @property
    def shortest_s(self) -> float: ...


@dataclass(frozen=True)
class PhaseLimits:
    """Fixed seconds a rank may stay in a phase without a new beat (the configured ones, never learned)."""

    setup_s: float
    step_s: float
    checkpoint_s: float

    @classmethod
    def from_config(cls, health: HealthConfig) -> "PhaseLimits":
        return cls(health.heartbeat_setup_s, health.heartbeat_step_s, health.heartbeat_checkpoint_s)

    def limit_s(self, phase: str) -> float | None:
        """The limit of ``phase``; None for ``done`` (a finished rank cannot hang)."""
        if phase == "done":
            return None
        return {"setup": self.setup_s, "step": self.step_s}.get(phase, self.checkpoint_s)

    def limit(self, phase: str) -> PhaseLimit | None:
        if phase not in LIMITED_PHASES:
            return None
        seconds = self.limit_s(phase) or 0.0
        return PhaseLimit(cast(LimitedPhase, phase), seconds, "configured", seconds, 0, why_configured="fixed limits")

    @property
    def shortest_s(self) -> float:
        return min(self.setup_s, self.step_s, self.checkpoint_s)


def describe_limits(limits: Limits) -> str:
    """Every phase's limit and its derivation, for the rank's log."""
    return "; ".join(limit.describe() for phase in LIMITED_PHASES if (limit := limits.limit(phase)) is not None)


def overdue_s(beat: Beat, now_s: float, limits: Limits) -> float | None:
    """Seconds past the phase's limit since ``beat``, or None while the rank is within it."""
    limit = limits.limit(beat.phase)
    if limit is None:
        return None
    late = now_s - beat.time_s - limit.limit_s
    return late if late > 0 else None


def poll_interval_s(limits: Limits) -> float:
    """A tenth of the shortest limit, between 0.5 and 10 s: detection within ~1.1x the limit."""
    return min(10.0, max(0.5, limits.shortest_s / 10))


@dataclass(frozen=True)
class StallReport:
    """What a rank was doing when its watchdog fired."""

    rank: int
    host: str
    phase: Phase
    step: int
    silent_s: float
    waiting: bool
    """The main thread is waiting for other ranks (a victim of the hang, not its cause)."""
    where: str


def innermost_location(frame: FrameType | None) -> tuple[bool, str]:
    """(waiting for other ranks?, ``file:line in function``) of the innermost frame of a stack."""
    if frame is None:
        return False, "no Python frame (the main thread has exited)"
    code = frame.f_code
    path = code.co_filename.replace(os.sep, "/")
    waiting = any(marker in path for marker in WAITING_MARKERS)
    return waiting, f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"


@dataclass(frozen=True)
class Suspects:
    ranks: tuple[int, ...]
    hosts: tuple[str, ...]
    why: str


def choose_suspects(beats: dict[int, Beat], reports: dict[int, StallReport], world_size: int) -> Suspects:
    """Which ranks most likely caused the hang, from their last beats and stall reports.

    Busy ranks (not waiting for others) and silent ranks (no report: frozen or
    gone) are suspects. When every rank reports waiting (a network or NCCL
    hang), the ranks behind the others' step are; if none is behind, nobody is
    blamed: excluding a random healthy node helps no one.
    """
    busy = sorted(r for r, rep in reports.items() if not rep.waiting)
    silent = sorted(set(range(world_size)) - set(reports))
    if busy or silent:
        parts = []
        if busy:
            parts.append(f"rank(s) {_ranks(busy)} busy outside any collective")
        if silent:
            parts.append(f"rank(s) {_ranks(silent)} did not report (frozen or gone)")
        ranks = tuple(sorted(set(busy) | set(silent)))
        why = "; ".join(parts)
    else:
        steps = {rank: beat.step for rank, beat in beats.items()}
        lowest = min(steps.values(), default=0)
        behind = tuple(sorted(r for r, s in steps.items() if s == lowest)) if len(set(steps.values())) > 1 else ()
        if not behind:
            return Suspects((), (), "every rank is waiting for the others at the same step: no suspect node")
        ranks, why = behind, f"every rank waits; rank(s) {_ranks(behind)} are behind at step {lowest}"
    hosts = tuple(sorted({beats[r].host for r in ranks if r in beats}))
    return Suspects(ranks, hosts, why)


def _ranks(ranks: list[int] | tuple[int, ...]) -> str:
    shown = ",".join(str(r) for r in ranks[:16])
    return shown + (f",... ({len(ranks)} in all)" if len(ranks) > 16 else "")


def stall_path(directory: Path, rank: int) -> Path:
    return directory / f"stall-{rank:05d}.json"


def read_stall_reports(directory: Path) -> dict[int, StallReport]:
    reports: dict[int, StallReport] = {}
    for path in sorted(directory.glob("stall-*.json")):
        try:
            report = StallReport(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as exc:
            log.warning("skipping stall report %s: %s", path, exc)
            continue
        reports[report.rank] = report
    return reports


def kill_children() -> None:
    """Kill this process's children (checkpoint writers, queue managers): ``os._exit`` skips their
    shutdown, and orphans left behind keep the Slurm step, and so the job, alive."""
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(children, timeout=5)


def exit_hung(code: int) -> None:
    """End a hung rank now: its children, then itself, skipping shutdown that would wait on the hang."""
    kill_children()
    os._exit(code)


class Watchdog:
    """Watches one rank's heartbeat from a daemon thread; on a hang, diagnoses, records and exits."""

    def __init__(
        self,
        heartbeat: Heartbeat,
        limits: Limits,
        *,
        world_size: int,
        log_path: Path,
        bad_nodes_path: Path,
        events: EventLog | None,
        poll_s: float | None = None,
        grace_s: float | None = None,
        exit_process: Callable[[int], Any] = exit_hung,
    ) -> None:
        self.heartbeat = heartbeat
        self.limits = limits
        self.world_size = world_size
        self.log_path = log_path
        self.bad_nodes_path = bad_nodes_path
        self.events = events
        self.poll_s = poll_s if poll_s is not None else poll_interval_s(limits)
        self.grace_s = grace_s if grace_s is not None else 3 * self.poll_s + 1
        self._exit_process = exit_process
        self._stop = threading.Event()
        self._main = threading.main_thread()
        self._thread = threading.Thread(target=self._run, name="air-hpc-watchdog", daemon=True)

    def start(self) -> "Watchdog":
        self._thread.start()
        log.info("watchdog on (poll %.1fs): %s", self.poll_s, describe_limits(self.limits))
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.poll_s + 1)

    def __enter__(self) -> "Watchdog":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            beat = self.heartbeat.last
            late = overdue_s(beat, time.time(), self.limits)
            if late is not None:
                self._on_hang(beat)
                return

    def _on_hang(self, beat: Beat) -> None:
        try:
            self._diagnose_and_record(beat)
        except BaseException:
            log.exception("watchdog: recording the hang failed; exiting anyway")
        finally:
            for handler in logging.getLogger().handlers:
                handler.flush()
            self._exit_process(int(ExitCode.HUNG))

    def _diagnose_and_record(self, beat: Beat) -> None:
        silent_s = time.time() - beat.time_s
        frame = sys._current_frames().get(self._main.ident or -1)
        waiting, where = innermost_location(frame)
        limit = self.limits.limit(beat.phase)
        how = limit.describe() if limit is not None else "no limit"
        log.error(
            "watchdog: rank %d made no progress in %s (step %d) for %.0f s (%s); main thread at %s%s",
            beat.rank,
            beat.phase,
            beat.step,
            silent_s,
            how,
            where,
            " (waiting for other ranks)" if waiting else "",
        )
        self._dump_stacks()
        self.heartbeat.flush()
        directory = self.heartbeat.directory
        report = StallReport(beat.rank, beat.host, beat.phase, beat.step, round(silent_s, 3), waiting, where)
        tmp = directory / f".stall-{beat.rank:05d}.tmp"
        atomic_write(stall_path(directory, beat.rank), json.dumps(asdict(report)), durable=False, tmp=tmp)
        self._stop.wait(self.grace_s)
        suspects = choose_suspects(read_beats(directory), read_stall_reports(directory), self.world_size)
        log.error("watchdog: %s; suspect node(s): %s", suspects.why, ",".join(suspects.hosts) or "none")
        if not write_exit_code(directory, ExitCode.HUNG):
            return
        if suspects.hosts:
            reason = (
                f"hung: {suspects.why}; rank {beat.rank} saw no progress for {silent_s:.0f} s "
                f"in phase {beat.phase} at step {beat.step}"
            )
            append_bad_nodes(self.bad_nodes_path, suspects.hosts, reason)
        if self.events is not None:
            self.events.emit(
                Hang(
                    step=beat.step,
                    phase=beat.phase,
                    silent_s=round(silent_s, 3),
                    detected_by=beat.rank,
                    suspect_ranks=list(suspects.ranks),
                    suspect_nodes=list(suspects.hosts),
                    why=suspects.why,
                    limit_s=None if limit is None else round(limit.limit_s, 3),
                    limit=how,
                )
            )

    def _dump_stacks(self) -> None:
        """All threads' stacks into the rank's log and onto stderr (the batch log)."""
        for handler in logging.getLogger().handlers:
            handler.flush()
        with open_append(self.log_path) as out:
            out.write(f"--- watchdog: Python stacks of all threads of rank {self.heartbeat.rank} (pid {os.getpid()})\n")
            out.flush()
            faulthandler.dump_traceback(file=out, all_threads=True)
        faulthandler.dump_traceback(file=sys.__stderr__ or sys.stderr, all_threads=True)
