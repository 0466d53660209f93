"""The seeded fault schedule: which kinds strike at which step, decided before anything runs.

Pure: the same kinds, count, seed and step count always give the same schedule,
so a campaign that found a bug can be replayed exactly. Faults are placed by step,
never by wall-clock time: a fault strikes a fraction of a step after its step was
logged, so it lands at the same point of the run on a slow and on a fast machine,
and never later than the second-to-last step, so training is left when it lands.
"""

import random
from dataclasses import dataclass

from air_hpc.errors import UserError

#: Every fault kind ``air-hpc chaos`` knows, in the order the docs list them.
FAULT_KINDS: tuple[str, ...] = (
    "preempt",
    "slurm-preempt",
    "node-kill",
    "rank-kill",
    "hang",
    "straggler",
    "ckpt-kill",
    "ckpt-hang",
)

#: Kinds the job rides out without a restart (every other kind stops it and it resumes from a checkpoint).
NO_RESTART_KINDS = frozenset({"straggler"})


@dataclass(frozen=True)
class Fault:
    number: int
    """1 for the first fault."""
    kind: str
    after_step: int
    """Strike once the run has logged this step (and resumed from the previous fault)."""
    delay_steps: float
    """Then wait this fraction of the run's step time, so faults also land inside steps and saves, not only at
    step ends; a fraction of a step, not seconds, so a slow machine and a fast one are struck at the same step."""


def parse_kinds(text: str) -> tuple[str, ...]:
    """``preempt,rank-kill`` -> the kinds, each once; an unknown kind is one clear line."""
    kinds = tuple(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    unknown = [k for k in kinds if k not in FAULT_KINDS]
    if unknown or not kinds:
        raise UserError(
            f"--faults {text!r}: unknown fault kind(s) {', '.join(map(repr, unknown)) or '(none given)'}; "
            f"expected a comma-separated list of {', '.join(FAULT_KINDS)}"
        )
    return kinds


def last_fault_step(total_steps: int) -> int:
    """The latest step a fault may follow: it then lands inside the next step, and a whole step is left after it."""
    return max(1, total_steps - 2)


def plan(kinds: tuple[str, ...], count: int, seed: int, total_steps: int) -> tuple[Fault, ...]:
    """``count`` faults of the given kinds at ascending steps in ``[1, last_fault_step(total_steps)]``.

    Every kind appears once before any repeats (when ``count`` allows), so a short
    campaign still covers what it was asked to cover.
    """
    if count < 0:
        raise UserError(f"--count {count}: expected 0 or more faults")
    if count and total_steps < 2:
        raise UserError(f"train.steps {total_steps}: a fault campaign needs at least 2 steps")
    rng = random.Random(seed)
    chosen = list(kinds) * (count // len(kinds)) + rng.sample(list(kinds), count % len(kinds))
    rng.shuffle(chosen)
    steps = sorted(rng.randint(1, last_fault_step(total_steps)) for _ in range(count))
    return tuple(
        Fault(number=i + 1, kind=kind, after_step=step, delay_steps=round(rng.uniform(0.0, 1.0), 3))
        for i, (kind, step) in enumerate(zip(chosen, steps, strict=True))
    )
