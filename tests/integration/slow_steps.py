"""Slow every training step of a job by a fixed time: a ``sitecustomize`` on the job's PYTHONPATH.

For tests whose event must land while the run still trains (a preemption, a time limit): gpt-tiny's steps
take a fraction of a second, so a run would otherwise finish before Slurm acts.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_SITECUSTOMIZE = """
import sys, threading, time


def _patch():
    while not hasattr(sys.modules.get("air_hpc.train.loop"), "StepRunner"):
        time.sleep(0.02)
    runner = sys.modules["air_hpc.train.loop"].StepRunner
    original = runner.step

    def step(self, consumed):
        time.sleep({seconds!r})
        return original(self, consumed)

    runner.step = step


threading.Thread(target=_patch, daemon=True).start()
"""


def slow_steps_override(directory: Path, seconds: float) -> str:
    """The ``--set`` that puts a step-slowing ``sitecustomize`` (in ``directory``) on the job's PYTHONPATH."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(_SITECUSTOMIZE.replace("{seconds!r}", repr(seconds)))
    return f"env.PYTHONPATH={directory}:{REPO}"
