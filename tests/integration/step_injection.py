"""Change a job's training steps from outside: a ``sitecustomize`` on the job's PYTHONPATH.

In the ranks where ``when`` holds, a thread waits until the trainer has imported
``air_hpc.train.loop`` and replaces ``StepRunner.step`` with the test's ``step(self, consumed)``,
which may call ``original``: a delay so that an event lands while the run still trains (gpt-tiny's
steps take a fraction of a second), a crash or a hang in a given step.
"""

import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_SITECUSTOMIZE = """
import os, signal, sys, threading, time
{prelude}

def _patch():
    while not hasattr(sys.modules.get("air_hpc.train.loop"), "StepRunner"):
        time.sleep(0.02)
    runner = sys.modules["air_hpc.train.loop"].StepRunner
    original = runner.step

{step}
    runner.step = step


if {when}:
    threading.Thread(target=_patch, daemon=True).start()
"""


def step_injection(directory: Path, step: str, when: str = "True", prelude: str = "") -> str:
    """Write the ``sitecustomize`` into ``directory``; returns the ``--set`` that puts it on the job's PYTHONPATH.

    ``step`` is the source of ``def step(self, consumed)``; ``when`` a Python condition on the rank's
    environment; ``prelude`` module-level code run in every rank before it.
    """
    directory.mkdir(parents=True, exist_ok=True)
    source = _SITECUSTOMIZE.format(
        prelude=textwrap.dedent(prelude),
        step=textwrap.indent(textwrap.dedent(step).strip("\n"), "    ") + "\n",
        when=when,
    )
    (directory / "sitecustomize.py").write_text(source)
    return f"env.PYTHONPATH={directory}:{REPO}"


def slow_steps_override(directory: Path, seconds: float) -> str:
    """Every step of every rank sleeps ``seconds`` first."""
    step = f"""
    def step(self, consumed):
        time.sleep({seconds!r})
        return original(self, consumed)
    """
    return step_injection(directory, step)
