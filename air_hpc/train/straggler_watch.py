"""Each rank's busy time per step, gathered every window; rank 0 reports the stragglers and lists them.

Every ``health.straggler_window_steps`` steps the ranks gather their busy seconds per step
(one small collective; the host names once, at the first window), and rank 0 runs
:func:`air_hpc.health.stragglers.find_stragglers`. A node found in ``health.straggler_windows``
windows in a row (one slow window is too often the machine's noise) is reported, once per start: a
``straggler`` event (which ``status`` and ``report`` show) and a warning; with
``health.exclude_stragglers`` its node also goes on the bad-node list, which the batch script
excludes at the next start of the job.
"""

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from air_hpc.backend.collectives import gather_floats, gather_strings
from air_hpc.config.models import HealthConfig
from air_hpc.health.badnodes import append_bad_nodes
from air_hpc.health.busy import BusyMeter
from air_hpc.health.stragglers import Straggler, find_stragglers
from air_hpc.records.events import EventLog
from air_hpc.records.events import Straggler as StragglerEvent

log = logging.getLogger(__name__)


class StragglerWatch:
    """Call :meth:`begin` and :meth:`end` around each step on every rank; close when training ends.

    ``gather``/``gather_hosts`` are the collectives (every rank's values, by rank); injected for tests.
    """

    def __init__(
        self,
        health: HealthConfig,
        rank: int,
        host: str,
        events: EventLog,
        bad_nodes: Path,
        meter: BusyMeter,
        gather: Callable[[Sequence[float]], list[list[float]]] = gather_floats,
        gather_hosts: Callable[[str], list[str]] = gather_strings,
    ) -> None:
        self.health = health
        self.rank = rank
        self.host = host
        self.events = events
        self.bad_nodes = bad_nodes
        self.meter = meter.start()
        self._gather = gather
        self._gather_hosts = gather_hosts
        self._began_s = 0.0
        self._window: list[float] = []
        self._hosts: list[str] | None = None
        self._reported: set[str] = set()
        self._streak: dict[str, int] = {}
        """Consecutive windows each node was found slow in, up to the last."""

    def begin(self) -> None:
        self._began_s = self.meter.busy_s()

    def end(self, step: int) -> tuple[Straggler, ...]:
        """Record this step's busy time; at a window's end, gather and check (collective). Rank 0 returns the finds."""
        self._window.append(self.meter.busy_s() - self._began_s)
        if len(self._window) < self.health.straggler_window_steps:
            return ()
        per_rank = self._gather(self._window)
        if self._hosts is None:
            self._hosts = self._gather_hosts(self.host)
        self._window = []
        if self.rank != 0:
            return ()
        found = find_stragglers(per_rank, self._hosts, self.health.straggler_ratio, self.health.straggler_noise_sigmas)
        self._streak = {s.node: self._streak.get(s.node, 0) + 1 for s in found}
        persistent = tuple(s for s in found if self._streak[s.node] >= self.health.straggler_windows)
        for straggler in persistent:
            self._report(straggler, step)
        return persistent

    def _report(self, straggler: Straggler, step: int) -> None:
        if straggler.node in self._reported:
            return
        self._reported.add(straggler.node)
        excluded = self.health.exclude_stragglers
        log.warning(
            "straggler at step %d: %s%s",
            step,
            straggler.describe(),
            "; excluded from the next start" if excluded else "",
        )
        if excluded:
            append_bad_nodes(self.bad_nodes, [straggler.node], f"straggler: {straggler.describe()} at step {step}")
        self.events.emit(
            StragglerEvent(
                step=step,
                node=straggler.node,
                ranks=list(straggler.ranks),
                busy_s=round(straggler.busy_s, 6),
                reference_s=round(straggler.reference_s, 6),
                ratio=round(straggler.ratio, 3),
                noise_s=round(straggler.noise_s, 6),
                window_steps=self.health.straggler_window_steps,
                windows=self._streak[straggler.node],
                excluded=excluded,
            )
        )

    def close(self) -> None:
        self.meter.stop()
