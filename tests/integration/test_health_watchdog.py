"""The watchdog in real processes: three gloo ranks, one sleeps forever mid-step."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from air_hpc.exitcodes import ExitCode
from air_hpc.health.badnodes import read_bad_nodes
from air_hpc.records.events import read_events
from air_hpc.records.generation import read_exit_code
from air_hpc.records.rundir import RunDir

REPO = Path(__file__).parent.parent.parent
STEP_LIMIT_S = 4


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_hung_rank_is_detected_blamed_and_every_rank_exits_hung(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path / "run")
    world, hang_rank, hang_step, port = 3, 1, 5, free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.health_payload",
                str(run_dir.path),
                str(rank),
                str(world),
                str(port),
                str(hang_rank),
                str(hang_step),
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for rank in range(world)
    ]
    try:
        codes = [p.wait(timeout=75) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    outputs = [p.stdout.read().decode() if p.stdout else "" for p in procs]
    # The hung rank exits HUNG; the others either do too, or see their peer's connection close first and
    # fail (exit 1): under srun that does not matter, the start's verdict below is what the batch script reads.
    assert codes[hang_rank] == ExitCode.HUNG and set(codes) <= {ExitCode.HUNG, 1}, (codes, outputs)
    hung_at = json.loads((run_dir.heartbeat / "1-0" / "rank-00001.json").read_text())["time_s"]
    (event,) = [e for e in read_events(run_dir.events) if e["kind"] == "hang"]
    # Detected within 2x the limit of the hung rank's last beat.
    assert event["time"] - hung_at < 2 * STEP_LIMIT_S, event
    assert event["step"] == hang_step and event["suspect_ranks"] == [hang_rank]
    assert read_bad_nodes(run_dir.bad_nodes) == ("host1",)
    assert read_exit_code(run_dir.heartbeat / "1-0") == ExitCode.HUNG
    hung_log = run_dir.rank_log(hang_rank).read_text()
    assert "Python stacks of all threads of rank 1" in hung_log
    assert "health_payload.py" in hung_log and "in main" in hung_log
    victim_log = run_dir.rank_log(0).read_text()
    assert "(waiting for other ranks)" in victim_log and "distributed_c10d.py" in victim_log
