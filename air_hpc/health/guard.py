"""One call for the entry point: pre-flight check, heartbeat and watchdog of a rank.

``with rank_guard(...) as heartbeat:`` runs the pre-flight check (raising
:class:`~air_hpc.health.preflight.UnhealthyNodeError` on a bad node), then
starts the heartbeat in phase ``setup`` and the watchdog thread; the training
loop calls ``heartbeat.beat("load")`` before it resumes, ``heartbeat.beat("step", step)``
at each step and ``heartbeat.beat("save", step)`` (or ``sync_save``) at each save. The
limits are learned from the run's phase times (``health.learning``) unless
``health.learn_limits`` is off.
"""

import logging
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from air_hpc.config.models import JobConfig
from air_hpc.exitcodes import ExitCode
from air_hpc.health.heartbeat import Heartbeat
from air_hpc.health.learning import LearnedLimits
from air_hpc.health.preflight import PEER_WAIT_S, enforce, run_preflight
from air_hpc.health.watchdog import Limits, PhaseLimits, Watchdog
from air_hpc.records.events import EventLog, Start
from air_hpc.records.generation import generation, generation_dir, write_exit_code
from air_hpc.records.rundir import RunDir

log = logging.getLogger(__name__)

#: Generation directories kept for post-mortems (the current start and the ones before it).
KEEP_GENERATIONS = 3


@contextmanager
def rank_guard(
    job: JobConfig,
    run_dir: RunDir,
    rank: int,
    world_size: int,
    host: str,
    environ: Mapping[str, str],
    peer_wait_s: float = PEER_WAIT_S,
) -> Iterator[Heartbeat]:
    """Check this node, then watch this rank until the block ends (``peer_wait_s``: see ``preflight.enforce``)."""
    name = generation(environ)
    directory = generation_dir(run_dir, name)
    events = EventLog(run_dir.events)
    if rank == 0:
        events.emit(Start(generation=name, world_size=world_size, host=host))
        prune_generations(run_dir, keep=name)
    if job.health.preflight:
        enforce(run_preflight(job, host), run_dir, directory, rank, peer_wait_s)
    learned = LearnedLimits.for_rank(job.health, run_dir.phase_times, rank) if job.health.learn_limits else None
    limits: Limits = learned or PhaseLimits.from_config(job.health)
    heartbeat = Heartbeat(
        directory,
        rank,
        host,
        file_interval_s=heartbeat_file_interval_s(limits),
        observer=learned.observe if learned is not None else None,
    )
    watchdog = None
    if job.health.watchdog:
        watchdog = Watchdog(
            heartbeat,
            limits,
            world_size=world_size,
            log_path=run_dir.rank_log(rank),
            bad_nodes_path=run_dir.bad_nodes,
            events=events,
        ).start()
    try:
        yield heartbeat
        heartbeat.beat("done")
    finally:
        if watchdog is not None:
            watchdog.stop()
        if learned is not None:
            learned.persist()


def heartbeat_file_interval_s(limits: Limits) -> float:
    """A quarter of the shortest limit, at most 30 s: files fresh enough for the supervisor's backstop."""
    return min(30.0, limits.shortest_s / 4)


def record_verdict(run_dir: RunDir, environ: Mapping[str, str], code: ExitCode) -> None:
    """Tell the batch script why this rank stops (e.g. REQUEUE after a preemption save).

    The first rank to exit non-zero makes ``srun --kill-on-bad-exit`` kill the
    others, and ``srun`` then reports their SIGTERM (143) instead of our code.
    """
    write_exit_code(generation_dir(run_dir, generation(environ)), code)


def prune_generations(run_dir: RunDir, keep: str) -> None:
    """Remove the heartbeat directories of all but the newest starts (``keep`` always stays)."""
    if not run_dir.heartbeat.is_dir():
        return
    others = sorted(
        (p for p in run_dir.heartbeat.iterdir() if p.is_dir() and p.name != keep), key=lambda p: p.stat().st_mtime
    )
    for old in others[: max(len(others) - (KEEP_GENERATIONS - 1), 0)]:
        shutil.rmtree(old, ignore_errors=True)
