"""Hang limits learned from the run: pure derivation of each phase's limit from the times observed so far.

A fixed limit must fit the slowest run anyone will ever submit, so it is hours for a
checkpoint that saves in a second here. Once a phase has enough samples, its limit
becomes ``max(floor, factor x the observed high percentile)``, never above the
configured value (``health.heartbeat_*_s``), which stays the cap and the limit while
the run is warming up. A sample is one silent interval of a rank in that phase (from one
beat to the next), exactly what the watchdog compares against the limit.

Why each knob:

- percentile, not the maximum: one stall seen long ago (a slow filesystem minute) should not
  widen the limit for the rest of the run; with fewer samples than 1/(1 - p) it is the maximum;
- factor: headroom above normal jitter (another job's traffic, a garbage collection);
- floor: a phase that takes milliseconds must not be judged hung after a second's hiccup;
- warm-up: the first steps of each start compile, fill caches and allocate, so they are not
  step samples; they are a series of their own (:data:`WARMUP_STEP`), from which the step
  limit during a warm-up (and until the steps after warm-ups are enough to learn) is learned
  once it has a few samples, so a rank frozen right after an in-job restart, or early in a
  run, is caught in about the floor, not at the configured cap;
  phases seen once per start (setup, load) need a few starts before they learn.
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

LimitedPhase = Literal["setup", "load", "step", "save", "sync_save"]
"""The phases with a limit: ``save`` is an async save's blocking part, ``sync_save`` a save training waits for
(the final one, a preemption's, or every save when async saves are off); their times differ by orders of magnitude."""
LIMITED_PHASES: tuple[LimitedPhase, ...] = get_args(LimitedPhase)

#: Samples a phase needs before its limit is learned: steps come by the hundred, the rest a few per start.
MIN_SAMPLES: Mapping[LimitedPhase, int] = {"setup": 3, "load": 3, "step": 20, "save": 3, "sync_save": 3}

#: The samples of the steps of each start's warm-up, kept beside the phases' (``phase_times.json``).
WARMUP_STEP = "warmup_step"
#: Warm-up samples the step limit during a warm-up needs: one start gives ``learned_limit_warmup_steps`` of them.
MIN_WARMUP_SAMPLES = 3
#: Every series ``phase_times.json`` keeps.
SERIES: tuple[str, ...] = (*LIMITED_PHASES, WARMUP_STEP)

#: The configuration key that caps each phase (and is its limit until it learns).
CAP_KEYS: Mapping[LimitedPhase, str] = {
    "setup": "health.heartbeat_setup_s",
    "load": "health.heartbeat_checkpoint_s",
    "step": "health.heartbeat_step_s",
    "save": "health.heartbeat_checkpoint_s",
    "sync_save": "health.heartbeat_checkpoint_s",
}

Source = Literal["configured", "learned", "capped"]


@dataclass(frozen=True)
class LearnPolicy:
    """How limits are learned (``health.learn_limits`` and the ``health.learned_*`` keys)."""

    enabled: bool = True
    factor: float = 5.0
    percentile: float = 99.0
    floor_s: float = 30.0
    warmup_steps: int = 5


@dataclass(frozen=True)
class PhaseLimit:
    """One phase's limit and how it was derived, for the watchdog and for the verdict."""

    phase: LimitedPhase
    limit_s: float
    source: Source
    """``configured`` (not learned yet, or learning is off), ``learned``, or ``capped`` (learned above the cap)."""
    cap_s: float
    samples: int
    observed_s: float | None = None
    """The high percentile of the samples, when there were enough."""
    factor: float = 0.0
    percentile: float = 0.0
    floor_s: float = 0.0
    why_configured: str = ""
    """Why the configured value is in force (learning off, too few samples, warming up)."""
    warmup: bool = False
    """Learned from the steps of the starts' warm-ups (the step limit while this start warms up, or before
    enough steps after warm-ups were seen)."""

    def describe(self) -> str:
        """One line for a log and the hang verdict: the limit, which one it is, and how it was derived."""
        key = CAP_KEYS[self.phase]
        if self.source == "configured":
            return f"{self.phase} limit {self.limit_s:g} s, configured ({key}): {self.why_configured}"
        kind = "warm-up step" if self.warmup else self.phase
        learned = (
            f"max(floor {self.floor_s:g} s, {self.factor:g} x p{self.percentile:g} {self.observed_s:.3g} s "
            f"of {self.samples} {kind} samples)"
        )
        if self.source == "capped":
            return f"{self.phase} limit {self.limit_s:g} s, the configured cap ({key}): learned {learned} exceeds it"
        under = f"under the configured {self.cap_s:g} s ({key})"
        return f"{self.phase} limit {self.limit_s:g} s, learned: {learned}, {under}"


def high_percentile(values: Sequence[float], percentile: float) -> float:
    """The nearest-rank percentile (a value that occurred; the maximum while samples are few)."""
    if not values:
        raise ValueError("no samples")
    ordered = sorted(values)
    rank = math.ceil(percentile / 100 * len(ordered))
    return ordered[min(max(rank, 1), len(ordered)) - 1]


def derive_limit(
    phase: LimitedPhase,
    samples: Sequence[float],
    cap_s: float,
    policy: LearnPolicy,
    warming_up: str = "",
    warmup_samples: Sequence[float] = (),
) -> PhaseLimit:
    """``phase``'s limit from its samples: max(floor, factor x percentile), capped by ``cap_s``.

    ``warming_up`` (why this start is not past its warm-up yet, or empty), or too few samples of the
    step: the step limit is learned from ``warmup_samples`` (the warm-up steps seen so far, earlier
    starts' included; slower than the steps after them, so a safe bound for those too) once there are
    :data:`MIN_WARMUP_SAMPLES` of them; until then the configured one holds.
    """
    configured = PhaseLimit(phase, cap_s, "configured", cap_s, len(samples))
    if not policy.enabled:
        return _why(configured, "learning is off (health.learn_limits)")
    needed = MIN_SAMPLES[phase]
    if not warming_up and len(samples) >= needed:
        return _learned(phase, samples, cap_s, policy)
    if phase == "step" and len(warmup_samples) >= MIN_WARMUP_SAMPLES:
        return _learned(phase, warmup_samples, cap_s, policy, warmup=True)
    why = warming_up or f"{len(samples)} of the {needed} samples needed to learn"
    if phase == "step":
        why += f"; {len(warmup_samples)} of the {MIN_WARMUP_SAMPLES} warm-up step samples needed to learn"
    return _why(configured, why)


def _learned(
    phase: LimitedPhase, samples: Sequence[float], cap_s: float, policy: LearnPolicy, warmup: bool = False
) -> PhaseLimit:
    observed = high_percentile(samples, policy.percentile)
    learned = max(policy.floor_s, policy.factor * observed)
    return PhaseLimit(
        phase=phase,
        limit_s=min(learned, cap_s),
        source="learned" if learned < cap_s else "capped",
        cap_s=cap_s,
        samples=len(samples),
        observed_s=observed,
        factor=policy.factor,
        percentile=policy.percentile,
        floor_s=policy.floor_s,
        warmup=warmup,
    )


def _why(limit: PhaseLimit, why: str) -> PhaseLimit:
    return PhaseLimit(limit.phase, limit.limit_s, "configured", limit.cap_s, limit.samples, why_configured=why)
