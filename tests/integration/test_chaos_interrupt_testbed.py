"""``air-hpc chaos`` interrupted on the real testbed, run as a user runs it (issue 24 item 2).

The testbed comes from ``$SLURM_CONF`` alone (no ``--state-dir``), as after ``eval "$(air-hpc testbed env
--state-dir X)"``; a hang freezes one rank of the faulted copy; then the command gets SIGTERM. It must continue
the frozen rank and cancel both copies: a job was left RUNNING with a stopped rank.
"""

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest

from air_hpc.slurm.jobs import JobState
from air_hpc.testbed import Testbed
from tests.integration.test_chaos_testbed import overrides_for
from tests.integration.waiting import wait_ended, wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SUBMITTED = re.compile(r"chaos: submitted job (\d+) \(faults\) and job (\d+) \(reference\)")
FROZE = re.compile(r"chaos: fault 1 hang at step \d+: SIGSTOP rank \d+ pid (\d+) on \S+")


def first_match(lines: list[str], pattern: re.Pattern[str]) -> re.Match[str] | None:
    return next((m for line in list(lines) if (m := pattern.match(line))), None)


def test_sigterm_continues_the_frozen_rank_and_cancels_both_copies(testbed: Any, tmp_path: Path) -> None:
    # The watchdog must not end the hang before the SIGTERM does, on a loaded machine either.
    sets = [*overrides_for(tmp_path), "health.heartbeat_step_s=200", "health.heartbeat_checkpoint_s=220"]
    sets.append("health.learn_limits=false")  # nor a limit learned from its short run
    args = ["chaos", str(REPO / "configs/jobs/gpt-tiny-testbed.yaml"), "--faults", "hang", "--count", "1"]
    args += ["--seed", "1", "--timeout-s", "400", *(a for s in sets for a in ("--set", s))]
    # Where a default testbed would go: somewhere this test cleans up, should the rule fail.
    env = {**os.environ, **testbed.env, "XDG_STATE_HOME": str(tmp_path / "state")}
    proc = subprocess.Popen([sys.executable, "-m", "air_hpc", *args], env=env, text=True, stderr=subprocess.PIPE)
    lines: list[str] = []
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr or ()), daemon=True)
    reader.start()
    try:
        wait_for("the campaign to freeze a rank", lambda: first_match(lines, FROZE) or proc.poll() is not None, 300)
        frozen = first_match(lines, FROZE)
        assert frozen is not None, "".join(lines)
        rank = psutil.Process(int(frozen.group(1)))
        wait_for("the rank to stop", lambda: rank.status() == psutil.STATUS_STOPPED, 10)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        Testbed(tmp_path / "state" / "air-hpc" / "testbed").down()
    reader.join(timeout=10)
    text = "".join(lines)
    assert lines[0] == f"chaos: testbed {testbed.state_dir}\n", text
    submitted = first_match(lines, SUBMITTED)
    assert submitted is not None, text
    faulted, reference = submitted.group(1), submitted.group(2)
    assert "chaos: continued 1 stopped rank process(es) (SIGCONT)\n" in lines, text
    assert wait_ended(testbed.client, faulted, 120).state == JobState.CANCELLED
    # The untouched copy may have finished while the other stood frozen: then it is said, not cancelled.
    if (state := wait_ended(testbed.client, reference, 120).state) == JobState.CANCELLED:
        assert f"chaos: cancelled job(s) {reference}, {faulted}\n" in lines, text
    else:
        assert f"chaos: job {reference} had already ended ({state})\n" in lines, text
        assert f"chaos: cancelled job(s) {faulted}\n" in lines, text
    assert not rank.is_running() or rank.status() != psutil.STATUS_STOPPED
