"""How long this rank itself held up each step: its busy time, apart from waiting for other ranks.

Every rank of a synchronous job takes the same wall time per step (collectives couple them),
so a slow rank cannot be told from its step time: the others wait for it, inside
``torch.distributed`` or Megatron's p2p and grad-sync code. :class:`BusyMeter` samples where
the main thread is, from a daemon thread, and counts the time between samples as *waiting*
when it is in such code (:data:`air_hpc.health.watchdog.WAITING_MARKERS`) and as *busy*
otherwise. A gap between samples longer than the interval means this process could not run
at all (stopped, starved of CPU, swapping); that excess counts as busy: it is this node's
slowness, not another's.

On GPUs the host thread also waits for its own kernels at synchronising calls; the meter then
counts those as busy, which is still this rank's own time.
"""

import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

from air_hpc.health.watchdog import innermost_location

#: Sampling interval: fine enough for steps of a tenth of a second, cheap enough to leave on.
INTERVAL_S = 0.005


class BusyMeter:
    """Cumulative busy seconds of the thread that creates it (normally the main thread)."""

    def __init__(
        self,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        frame_of: Callable[[], FrameType | None] | None = None,
    ) -> None:
        self.interval_s = interval_s
        self._clock = clock
        ident = threading.get_ident()
        self._frame_of = frame_of or (lambda: sys._current_frames().get(ident))
        self._busy_s = 0.0
        self._last_s = clock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="air-hpc-busy-meter", daemon=True)

    def start(self) -> "BusyMeter":
        self._last_s = self._clock()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=1.0)

    def busy_s(self) -> float:
        return self._busy_s

    def sample(self) -> None:
        """Attribute the time since the last sample (the thread calls this; tests call it directly)."""
        now = self._clock()
        elapsed = now - self._last_s
        self._last_s = now
        waiting, _ = innermost_location(self._frame_of())
        stalled = max(elapsed - 2 * self.interval_s, 0.0)
        self._busy_s += stalled + (0.0 if waiting else elapsed - stalled)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()
