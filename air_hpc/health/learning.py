"""A rank's live hang limits: its heartbeat reports each phase's time, the limits follow (``health.limits``).

The rank's :class:`~air_hpc.health.heartbeat.Heartbeat` calls :meth:`LearnedLimits.observe`
with every silent interval it ends (one phase, from one beat to the next); the watchdog thread
reads :meth:`LearnedLimits.limit`. The samples of earlier starts come from the run
directory's ``phase_times.json``, which rank 0 keeps up to date, so limits learned before a
restart hold from the restart's first second (its setup included).

Threads: only the training thread observes; the watchdog reads one dict entry, replaced whole.
"""

import bisect
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import cast

from air_hpc.config.models import HealthConfig
from air_hpc.health.limits import (
    LIMITED_PHASES,
    MIN_SAMPLES,
    SERIES,
    WARMUP_STEP,
    LearnPolicy,
    LimitedPhase,
    PhaseLimit,
    derive_limit,
)
from air_hpc.records.phase_times import MAX_SAMPLES, read_phase_times, write_phase_times

log = logging.getLogger(__name__)

#: Rank 0 rewrites phase_times.json at most this often once the step limit is learned (a save or a start at once).
PERSIST_EVERY_S = 30.0


def caps_from_config(health: HealthConfig) -> dict[LimitedPhase, float]:
    """Each phase's configured limit, which caps what is learned (``health.heartbeat_*_s``)."""
    checkpoint = float(health.heartbeat_checkpoint_s)
    return {
        "setup": float(health.heartbeat_setup_s),
        "load": checkpoint,
        "step": float(health.heartbeat_step_s),
        "save": checkpoint,
        "sync_save": checkpoint,
    }


def policy_from_config(health: HealthConfig) -> LearnPolicy:
    return LearnPolicy(
        enabled=health.learn_limits,
        factor=health.learned_limit_factor,
        percentile=health.learned_limit_percentile,
        floor_s=float(health.learned_limit_floor_s),
        warmup_steps=health.learned_limit_warmup_steps,
    )


class _Samples:
    """One phase's newest samples, also kept sorted so that a percentile costs nothing per beat."""

    def __init__(self, values: Sequence[float]) -> None:
        self.recent: deque[float] = deque(values[-MAX_SAMPLES:])
        self.ordered = sorted(self.recent)

    def add(self, value: float) -> None:
        if len(self.recent) == MAX_SAMPLES:
            oldest = self.recent.popleft()
            del self.ordered[bisect.bisect_left(self.ordered, oldest)]
        self.recent.append(value)
        bisect.insort(self.ordered, value)


class LearnedLimits:
    """Every limited phase's current limit for one rank, learned from the run so far; see the module docstring."""

    def __init__(
        self,
        caps: Mapping[LimitedPhase, float],
        policy: LearnPolicy,
        history: Mapping[str, Sequence[float]],
        store: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``store``: where to keep the samples (rank 0's ``phase_times.json``); None on the other ranks."""
        self.caps, self.policy, self.store, self._clock = dict(caps), policy, store, clock
        self._samples = {phase: _Samples(history.get(phase, ())) for phase in LIMITED_PHASES}
        self._warmup = _Samples(history.get(WARMUP_STEP, ()))
        self._steps_seen = 0
        self._unsaved = False
        self._saved_at = clock()
        self._limits = {phase: self._derive(phase) for phase in LIMITED_PHASES}

    @classmethod
    def for_rank(cls, health: HealthConfig, phase_times: Path, rank: int) -> "LearnedLimits":
        """The limits of one rank of the run whose ``phase_times.json`` is ``phase_times``; rank 0 keeps the file."""
        policy = policy_from_config(health)
        history = read_phase_times(phase_times, SERIES) if policy.enabled else {}
        return cls(caps_from_config(health), policy, history, phase_times if rank == 0 and policy.enabled else None)

    def limit(self, phase: str) -> PhaseLimit | None:
        """``phase``'s limit now; None for a phase without one (``done``)."""
        return self._limits.get(cast(LimitedPhase, phase))

    def limit_s(self, phase: str) -> float | None:
        limit = self.limit(phase)
        return None if limit is None else limit.limit_s

    @property
    def shortest_s(self) -> float:
        """The shortest limit any phase can get (the watchdog polls a fraction of it)."""
        shortest = min(self.caps.values())
        return min(shortest, self.policy.floor_s) if self.policy.enabled else shortest

    def samples(self, series: str) -> tuple[float, ...]:
        """A phase's samples, or the warm-up steps' (:data:`~air_hpc.health.limits.WARMUP_STEP`)."""
        kept = self._warmup if series == WARMUP_STEP else self._samples[cast(LimitedPhase, series)]
        return tuple(kept.recent)

    def observe(self, phase: str, seconds: float) -> None:
        """A rank spent ``seconds`` in ``phase`` without a beat (the heartbeat's observer)."""
        if phase not in self._samples or not self.policy.enabled or seconds <= 0:
            return
        limited = cast(LimitedPhase, phase)
        if seconds >= self._limits[limited].limit_s:
            # A silence that reached its limit is a hang (this rank's or a frozen peer's it waited for), which the
            # watchdog's verdict ends: as a sample it would raise the limit a later hang is caught at (5 x 40 s).
            log.info("%s of %.1f s reached its limit: a hang, not a sample", phase, seconds)
            return
        if limited == "step":
            self._steps_seen += 1
            if self._steps_seen <= self.policy.warmup_steps:  # a start's first steps compile and allocate
                self._warmup.add(seconds)
                self._limits["step"] = self._derive("step")
                self._unsaved = True
                self.persist()  # a few per start, and a restart seconds later needs them
                return
        self._samples[limited].add(seconds)
        self._limits[limited] = self._derive(limited)
        self._unsaved = True
        # Until the step limit is learned every sample is kept at once: in-job restarts seconds apart would
        # otherwise each end before the periodic write, and no start would ever learn it.
        learning = len(self._samples[limited].recent) <= MIN_SAMPLES[limited]
        if limited != "step" or learning or self._clock() - self._saved_at >= PERSIST_EVERY_S:
            self.persist()

    def persist(self) -> None:
        """Write the samples to ``phase_times.json`` (rank 0; a failed write costs only samples)."""
        if self.store is None or not self._unsaved:
            return
        self._saved_at, self._unsaved = self._clock(), False
        try:
            write_phase_times(self.store, {series: self.samples(series) for series in SERIES})
        except OSError as exc:
            log.warning("phase times %s not written: %s", self.store, exc)

    def _derive(self, phase: LimitedPhase) -> PhaseLimit:
        warming = ""
        if phase == "step" and self._steps_seen < self.policy.warmup_steps:
            warming = f"warming up ({self._steps_seen} of this start's first {self.policy.warmup_steps} steps done)"
        samples = self._samples[phase].ordered
        return derive_limit(phase, samples, self.caps[phase], self.policy, warming, self._warmup.ordered)

    def summary(self) -> str:
        """The limits in force, one phase each, for the rank's log."""
        return "; ".join(self._limits[phase].describe() for phase in LIMITED_PHASES)
