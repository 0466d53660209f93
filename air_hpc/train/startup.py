"""Where a rank's start goes, phase by phase, from its process's creation to the end of its first step.

Start-up is paid again on every requeue and restart, so it is goodput lost each time; the
phases say which part to cut. Each rank keeps a :class:`StartupClock`; after the first step
of a start the ranks gather their phases (one collective) and rank 0 writes one ``startup``
event with every rank's seconds per phase (:func:`startup_event`), and the CPU seconds each
rank used until its first step: on a machine shared with other work, wall time says how long
the start took, CPU time how much work it was.
"""

import gc
import statistics
import time
from collections.abc import Callable, Sequence

from air_hpc.records.events import Startup

#: The phases in the order a start passes them.
PHASES: tuple[str, ...] = (
    "launch",  # process created -> our entry runs (interpreter, srun/submitit, air_hpc imports)
    "imports",  # torch and megatron-core
    "preflight",  # node health check, heartbeat, watchdog
    "rendezvous",  # default process group and Megatron's TP/PP/DP groups
    "model",  # model chunks, DDP, optimizer, scheduler
    "resume",  # find, verify and load the newest checkpoint (nothing on a first start)
    "data",  # open the token file, set up the step runner
    "first_step",  # the first training step of this start (warm-up included)
)

_gc_paused = False


def pause_gc() -> None:
    """Turn off Python's cyclic garbage collector for the start (idempotent); :func:`resume_gc` turns it back on.

    A rank's start creates millions of objects that live as long as the process (torch,
    megatron-core and Dynamo's modules, classes, dataclasses) and little cyclic garbage; the
    collector's passes over them while they load cost about a fifth of the imports' CPU time
    (measured on gpt-tiny: 4.35 -> 3.4 CPU s per process). Kept off through the model's build,
    whose optimizer imports TorchDynamo; back on before the checkpoint is loaded, whose
    temporaries may be large.
    """
    global _gc_paused
    if gc.isenabled():
        gc.disable()
        _gc_paused = True


def resume_gc() -> None:
    """Turn the collector back on if :func:`pause_gc` turned it off, after freezing what the start created.

    ``gc.freeze`` moves every object alive now to the permanent generation: the training steps'
    collections then never walk the start's objects again, and a forked checkpoint writer
    touches fewer of the parent's pages.
    """
    global _gc_paused
    if _gc_paused:
        gc.freeze()
        gc.enable()
        _gc_paused = False


def process_start_s() -> float:
    """Wall-clock creation time of this process (what the ``launch`` phase counts from)."""
    import psutil

    return float(psutil.Process().create_time())


class StartupClock:
    """Seconds spent in each phase of this rank's start; :meth:`mark` closes the phase that just ended."""

    def __init__(
        self,
        started_s: float,
        clock: Callable[[], float] = time.time,
        cpu_clock: Callable[[], float] = time.process_time,
    ) -> None:
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._last_s = started_s
        self._last_cpu_s = 0.0
        self.phases_s: dict[str, float] = {}
        self.cpu_phases_s: dict[str, float] = {}
        """This process's CPU seconds (all threads) per phase; ``launch`` counts from the process's creation."""
        self.cpu_to_first_step_s = 0.0
        """This process's CPU seconds (all threads, since it was created) when its first step began."""

    def mark(self, phase: str) -> None:
        if phase not in PHASES:
            raise ValueError(f"start-up phase {phase!r} is not one of {', '.join(PHASES)}")
        now, cpu = self._clock(), self._cpu_clock()
        self.phases_s[phase] = max(now - self._last_s, 0.0)
        self.cpu_phases_s[phase] = max(cpu - self._last_cpu_s, 0.0)
        self._last_s, self._last_cpu_s = now, cpu
        if phase == PHASES[PHASES.index("first_step") - 1]:
            self.cpu_to_first_step_s = cpu

    def vector(self) -> list[float]:
        """For a gather: wall seconds per phase in :data:`PHASES` order (0 for a phase not passed),
        CPU seconds per phase in the same order, then the CPU seconds to the first step."""
        wall = [self.phases_s.get(phase, 0.0) for phase in PHASES]
        cpu = [self.cpu_phases_s.get(phase, 0.0) for phase in PHASES]
        return wall + cpu + [self.cpu_to_first_step_s]


def startup_event(per_rank: Sequence[Sequence[float]], first_step: int) -> Startup:
    """The ``startup`` event from every rank's :meth:`StartupClock.vector`.

    ``to_first_step_s`` is the slowest rank's time from process creation to the start of
    its first step: the ranks meet in the first step's collectives, so the slowest one
    decides when training begins.
    """
    n = len(PHASES)
    ranks = [list(row[:n]) for row in per_rank]
    cpu_phases = [list(row[n : 2 * n]) for row in per_rank]
    cpu = [round(row[2 * n], 4) for row in per_rank]
    before_step = [sum(row[: PHASES.index("first_step")]) for row in ranks]
    slowest = max(range(len(ranks)), key=lambda r: before_step[r]) if ranks else 0
    return Startup(
        step=first_step,
        ranks=len(ranks),
        to_first_step_s=round(max(before_step, default=0.0), 4),
        slowest_rank=slowest,
        cpu_to_first_step_s=cpu,
        phases_s={phase: [round(row[i], 4) for row in ranks] for i, phase in enumerate(PHASES)},
        cpu_phases_s={phase: [round(row[i], 4) for row in cpu_phases] for i, phase in enumerate(PHASES)},
        median_s={
            phase: round(statistics.median(row[i] for row in ranks), 4) if ranks else 0.0
            for i, phase in enumerate(PHASES)
        },
    )
