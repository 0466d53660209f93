"""Polling until something happens, for tests that watch real processes, files and Slurm."""

import time
from collections.abc import Callable


def wait_for(what: str, condition: Callable[..., object], timeout_s: float, poll_s: float = 0.05) -> None:
    """Return once ``condition()`` is true; fail the test naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll_s)
