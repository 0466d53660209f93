"""Controller faults on the real testbed: a stopped controller fails every command at once; a lost sbatch answer
is found again through the job's --comment, and the run is never submitted twice."""

import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from air_hpc.config import load_job
from air_hpc.errors import SlurmUnreachableError
from air_hpc.exitcodes import ExitCode
from air_hpc.launch.submit import submit
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import latest_submission, pending_attempts, record_submission
from air_hpc.slurm.client import SlurmClient
from air_hpc.slurm.jobs import JobState
from tests.integration.test_jobs_testbed import PAYLOAD, TESTBED_JOB, cli
from tests.integration.waiting import wait_ended, wait_for

pytestmark = pytest.mark.integration


def stopped_controller_conf(testbed: Any, tmp_path: Path) -> Path:
    """The testbed's slurm.conf with the controller on a closed loopback port: what a stopped slurmctld looks like."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    lines = [
        line
        for line in Path(testbed.env["SLURM_CONF"]).read_text().splitlines()
        if not line.startswith("SlurmctldPort=")
    ]
    down = tmp_path / "slurm.conf"
    down.write_text("\n".join([*lines, f"SlurmctldPort={closed_port}", ""]))
    return down


def test_every_command_fails_at_once_when_the_controller_refuses(
    testbed: Any, tmp_path: Path, small_corpus: Path
) -> None:
    down = stopped_controller_conf(testbed, tmp_path)
    run = RunDir(tmp_path / "runs" / "down")
    record_submission(run, "1", "slurm")
    commands = [
        ["submit", str(TESTBED_JOB), "--set", f"run.root={tmp_path}/runs", "--set", f"data.path={small_corpus}"],
        ["status", str(run.path)],
        ["cancel", str(run.path)],
        ["status"],
    ]
    for args in commands:
        started = time.monotonic()
        result = cli(testbed, *args, conf=down)
        elapsed = time.monotonic() - started
        assert result.returncode == ExitCode.UNREACHABLE, (args, result.stderr)
        assert elapsed < 8, f"air-hpc {args[0]} took {elapsed:.1f} s with the controller refusing connections"
        assert "connection refused at 127.0.0.1:" in result.stderr and result.stderr.count("error:") == 1
    submitted = RunDir(tmp_path / "runs" / "gpt-tiny-testbed")
    assert [a.token for a in pending_attempts(submitted)] == [], "the refused sbatch is recorded as not submitted"


class LosesSbatchAnswer(SlurmClient):
    """The real client, except that every sbatch's answer is lost after the controller accepted the job."""

    def _run_once(
        self, args: Sequence[str], input_text: str | None, timeout_s: float, *, probe_slow: bool = False
    ) -> subprocess.CompletedProcess[str]:
        result = super()._run_once(args, input_text, timeout_s, probe_slow=probe_slow)
        if args[0] == "sbatch" and "--test-only" not in args and result.returncode == 0:
            return subprocess.CompletedProcess(list(args), 1, "", "sbatch: error: Socket timed out on send/recv")
        return result


def test_a_lost_sbatch_answer_is_found_by_comment_and_managed(testbed: Any, tmp_path: Path, small_corpus: Path) -> None:
    payload = tmp_path / "payload.py"
    payload.write_text(PAYLOAD)
    job = load_job(TESTBED_JOB, [f"run.root={tmp_path}", "run.name=lost-answer", f"data.path={small_corpus}"])
    run_dir = RunDir.of(job)
    command = [sys.executable, str(payload), "wait", str(run_dir.path), str(int(ExitCode.REQUEUE))]
    losing = LosesSbatchAnswer(env=testbed.env, retries=1, backoff_s=0.5)
    with pytest.raises(SlurmUnreachableError, match="attempt is recorded"):
        submit(job, "slurm", losing, step_command=command)
    (attempt,) = pending_attempts(run_dir)
    queued = [r for r in testbed.client.squeue() if r.name == "lost-answer"]
    assert len(queued) == 1, "the controller did queue the job"
    job_id = queued[0].job_id
    assert f"Comment={attempt.token}" in testbed.client.run(["scontrol", "show", "job", job_id]).stdout

    status = cli(testbed, "status", str(run_dir.path), "--json")
    assert status.returncode == 0, status.stderr
    assert f'"job_id": "{job_id}"' in status.stdout
    assert latest_submission(run_dir).job_id == job_id and pending_attempts(run_dir) == []

    sets = [f"run.root={tmp_path}", "run.name=lost-answer", f"data.path={small_corpus}"]
    again = cli(testbed, "submit", str(TESTBED_JOB), *(arg for item in sets for arg in ("--set", item)))
    assert again.returncode == ExitCode.USAGE, again.stderr
    assert job_id in again.stderr
    assert [r.job_id for r in testbed.client.squeue() if r.name == "lost-answer"] == [job_id], "submitted once"

    wait_for("the job to run", lambda: bool(list(run_dir.path.glob("ready-0-*"))), 60, 0.3)
    cancelled = cli(testbed, "cancel", str(run_dir.path))
    assert cancelled.returncode == 0 and f"cancelled job {job_id}" in cancelled.stdout, cancelled.stderr
    assert wait_ended(testbed.client, job_id, 60, poll_s=0.3).state is JobState.CANCELLED
    assert attempt.token.startswith("air-hpc-")
