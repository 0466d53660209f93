"""TensorBoard event files of a run (``observe.tensorboard``): step scalars plus checkpoint, stop and resume markers.

Written by the one rank that holds the loss (the last pipeline stage's first
DP/TP rank, the same that writes metrics.jsonl) with torch's ``SummaryWriter``.
A resumed start passes ``purge_step`` so TensorBoard hides what the previous
start logged after the checkpoint it resumed from, as ``MetricsWriter`` drops
those lines: the curves read like one uninterrupted run.
"""

import importlib.util
import logging
from pathlib import Path

from air_hpc.errors import ConfigError

log = logging.getLogger(__name__)

#: Seconds between flushes of the event file: a killed rank loses at most this much of the curves.
FLUSH_S = 10


def check_available() -> None:
    """Fail before training starts when ``observe.tensorboard`` is on but the package is missing."""
    if importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("observe.tensorboard: true needs the tensorboard package (pip install tensorboard)")


class TensorBoardLog:
    def __init__(self, directory: Path, first_step: int, resumed_from: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        directory.mkdir(parents=True, exist_ok=True)
        log.info("TensorBoard events in %s", directory)
        self._writer = SummaryWriter(
            str(directory), purge_step=first_step if resumed_from is not None else None, flush_secs=FLUSH_S
        )
        if resumed_from is not None:
            self._writer.add_scalar("markers/resumed_from_step", resumed_from, first_step)
            self._writer.add_text("markers", f"resumed from the checkpoint of step {resumed_from}", first_step)

    def step(
        self, step: int, loss: float, lr: float, tokens_per_s: float, grad_norm: float, step_time_s: float
    ) -> None:
        w = self._writer
        w.add_scalar("train/loss", loss, step)
        w.add_scalar("train/lr", lr, step)
        w.add_scalar("train/grad_norm", grad_norm, step)
        w.add_scalar("perf/tokens_per_s", tokens_per_s, step)
        w.add_scalar("perf/step_time_s", step_time_s, step)

    def checkpoint(self, step: int, reason: str) -> None:
        """A save of ``step`` began (``interval``, ``final`` or why the run stopped)."""
        self._writer.add_scalar("markers/checkpoint_step", step, step)
        self._writer.add_text("markers", f"checkpoint save of step {step} ({reason})", step)

    def stop(self, step: int, reason: str) -> None:
        """The ranks agreed to stop at ``step`` to be requeued (signal or time limit)."""
        self._writer.add_scalar("markers/stop_step", step, step)
        self._writer.add_text("markers", f"stopped at step {step} ({reason}); asking for a requeue", step)

    def close(self) -> None:
        self._writer.close()
