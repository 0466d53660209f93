"""``checkpoint.interval_steps: auto``: the checkpoint interval from the save cost and the failure rate.

Daly's higher-order refinement of Young's ``sqrt(2 * save_cost * MTBF)`` ("A higher order estimate of
the optimum checkpoint interval for restart dumps", 2006) gives the compute time between checkpoints
that minimises the expected waste: time spent saving plus work redone after a failure. The save
cost is what training waits for a save (an async save's snapshot stall, a sync save's whole write),
measured in this job and agreed across ranks (the slowest rank's), so every rank checkpoints at the
same steps. The first periodic save comes right after the first step of a start: it measures the cost.

With in-memory snapshots (``checkpoint.memory_interval_steps``) the persistent checkpoint is the
second level of a two-level scheme (Vaidya 1994; Moody et al., SCR, 2010): a failure the job survives
in place (a crashed rank, a dead node while a hot spare is left) redoes at most the memory interval,
and only the failures that end the job start redo work since the last persistent checkpoint. With
``K`` spares that is one failure in ``K + 1``, so the persistent level's interval is Daly's for a
mean time between failures ``(K + 1)`` times the nodes' (:func:`persistent_mtbf_h`).
"""

import logging
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from air_hpc.records.events import CheckpointInterval

__all__ = ["CheckpointSchedule", "IntervalChoice", "choose", "daly_interval_s", "expected_waste"]

log = logging.getLogger(__name__)


def daly_interval_s(save_cost_s: float, mtbf_s: float) -> float:
    """Compute time between checkpoints that minimises the expected waste (Daly 2006, eq. 37)."""
    if save_cost_s <= 0:
        return 0.0
    if save_cost_s >= 2 * mtbf_s:
        return mtbf_s
    ratio = save_cost_s / (2 * mtbf_s)
    return math.sqrt(2 * save_cost_s * mtbf_s) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - save_cost_s


def expected_waste(save_cost_s: float, interval_s: float, mtbf_s: float) -> float:
    """Fraction of wall time lost to saving and to redoing work after failures (first order, restarts excluded).

    Each interval of ``interval_s`` compute costs ``save_cost_s`` more; a failure strikes on average
    half-way through an interval and its save.
    """
    period = interval_s + save_cost_s
    return save_cost_s / period + period / (2 * mtbf_s)


def persistent_mtbf_h(mtbf_h: float, memory_snapshots: bool, spare_nodes: int, nodes: int) -> float:
    """The mean time between failures that lose the work since the last persistent checkpoint.

    Without in-memory snapshots (or with one node, where no buddy copy survives the node), every failure does.
    With them, only a failure that finds no spare left ends the job start: one in ``spare_nodes + 1``.
    """
    if not memory_snapshots or nodes < 2:
        return mtbf_h
    return mtbf_h * (spare_nodes + 1)


@dataclass(frozen=True)
class IntervalChoice:
    steps: int
    interval_s: float
    save_cost_s: float
    step_time_s: float
    mtbf_h: float
    expected_waste: float

    def to_event(self, step: int) -> CheckpointInterval:
        """The ``checkpoint_interval`` event of this choice, made after the save of ``step``."""
        return CheckpointInterval(
            step=step,
            steps=self.steps,
            interval_s=round(self.interval_s, 6),
            save_cost_s=round(self.save_cost_s, 6),
            step_time_s=round(self.step_time_s, 6),
            mtbf_h=round(self.mtbf_h, 6),
            expected_waste=round(self.expected_waste, 6),
        )


def choose(save_cost_s: float, step_time_s: float, mtbf_h: float) -> IntervalChoice:
    """The interval in whole steps (at least one) for a measured save cost and step time."""
    mtbf_s = mtbf_h * 3600.0
    interval_s = daly_interval_s(save_cost_s, mtbf_s)
    steps = max(1, round(interval_s / step_time_s)) if step_time_s > 0 else 1
    return IntervalChoice(
        steps=steps,
        interval_s=interval_s,
        save_cost_s=save_cost_s,
        step_time_s=step_time_s,
        mtbf_h=mtbf_h,
        expected_waste=expected_waste(save_cost_s, steps * step_time_s, mtbf_s),
    )


def agree_max(values: Sequence[float]) -> list[float]:
    """The largest of each value across ranks (one MAX all-reduce); the values as they are without a group."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return list(values)
    on_gpu = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    tensor = torch.tensor(list(values), dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [float(v) for v in tensor.tolist()]


class CheckpointSchedule:
    """When the periodic saves are due: every ``interval_steps``, or ``auto`` from measured costs.

    Call :meth:`due` after each step and :meth:`saved` after each periodic save, on every rank.
    """

    #: Recent steps whose median time sizes the auto interval.
    RECENT_STEPS = 10

    def __init__(self, interval_steps: int | str, mtbf_h: float | None) -> None:
        self.fixed = interval_steps if isinstance(interval_steps, int) else None
        self.mtbf_h = mtbf_h
        self.choice: IntervalChoice | None = None
        self._last_saved: int | None = None
        self._step_times: list[float] = []

    def due(self, step: int, step_time_s: float) -> bool:
        self._step_times = [*self._step_times[-(self.RECENT_STEPS - 1) :], step_time_s]
        if self.fixed is not None:
            return step % self.fixed == 0
        if self.choice is None or self._last_saved is None:
            return True
        return step - self._last_saved >= self.choice.steps

    def missed(self, step: int, newest: int | None, total_steps: int) -> bool:
        """A run resumed at ``step`` from elsewhere than a checkpoint: was a periodic save due after ``newest``?

        With a fixed interval, whether a multiple of it lies in ``(newest, step]`` (the final step saves anyway);
        ``auto`` saves at the first step after a start by itself.
        """
        if self.fixed is None or step >= total_steps:
            return False
        return step // self.fixed * self.fixed > (newest or 0)

    def saved(self, step: int, save_cost_s: float) -> IntervalChoice | None:
        """Record a periodic save; returns the new auto choice when it changed (to log it), else None."""
        self._last_saved = step
        if self.fixed is not None or self.mtbf_h is None:
            return None
        cost, step_time = agree_max([save_cost_s, statistics.median(self._step_times)])
        choice = choose(cost, step_time, self.mtbf_h)
        changed = self.choice is None or choice.steps != self.choice.steps
        self.choice = choice
        if changed:
            log.info(
                "checkpoint interval auto: every %d step(s) (%.1f s of compute) for a %.3f s save and MTBF %g h; "
                "expected waste %.2f%%",
                choice.steps,
                choice.interval_s,
                choice.save_cost_s,
                choice.mtbf_h,
                100 * choice.expected_waste,
            )
        return choice if changed else None
