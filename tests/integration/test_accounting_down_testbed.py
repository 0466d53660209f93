"""slurmdbd killed on the real testbed while slurmctld answers: commands say which daemon is down and fall back to
``squeue`` and the run's records instead of reporting a dead controller (issue 27 item 8)."""

import json
import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest

from air_hpc.errors import AccountingUnreachableError
from air_hpc.slurm.jobs import JobState
from tests.integration.test_jobs_testbed import PAYLOAD, cli, submit_payload, wait_ready, wait_state

pytestmark = pytest.mark.integration


@pytest.fixture
def payload(tmp_path: Path) -> Path:
    path = tmp_path / "payload.py"
    path.write_text(PAYLOAD)
    return path


def kill_slurmdbd(testbed: Any) -> None:
    """SIGKILL the testbed's slurmdbd, by the PID (and start time) the testbed recorded."""
    recorded = next(d for d in testbed.testbed._read_state()["daemons"] if d["name"] == "slurmdbd")
    proc = psutil.Process(recorded["pid"])
    assert abs(proc.create_time() - recorded["create_time"]) < 1.0, "the recorded PID is another process now"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def test_a_dead_slurmdbd_is_named_and_the_queue_still_answers(testbed: Any, tmp_path: Path, payload: Path) -> None:
    ended = submit_payload(testbed, tmp_path / "runs", payload, "quick", "ended")
    assert wait_state(testbed, ended.job_id) is JobState.COMPLETED
    live = submit_payload(testbed, tmp_path / "runs", payload, "wait", "live")
    wait_ready(live.run_dir, 4)
    kill_slurmdbd(testbed)
    try:
        with pytest.raises(AccountingUnreachableError, match=r"Slurm accounting \(slurmdbd\) unreachable"):
            testbed.client.sacct([ended.job_id])
        result = cli(testbed, "status", str(live.run_dir), "--json")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["state"] == "RUNNING"
        result = cli(testbed, "status", str(ended.run_dir), "--json")
        assert result.returncode == 0, result.stderr
        status = json.loads(result.stdout)
        assert status["state"] == "UNKNOWN" and "slurmdbd" in status["reason"], status
        assert "controller unreachable" not in result.stderr
        result = cli(testbed, "runs", "--root", str(tmp_path / "runs"), "--json")
        assert result.returncode == 0, result.stderr
        assert {r["name"]: r["state"] for r in json.loads(result.stdout)["runs"]} == {
            "ended": "UNKNOWN",
            "live": "RUNNING",
        }
    finally:
        testbed.testbed.up((2, 4, 2))  # restarts only the daemon that is down
    back = testbed.client.job_status(ended.job_id)
    assert back is not None and (back.state, back.source) == (JobState.COMPLETED, "sacct")
