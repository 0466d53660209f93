"""The fleet report of a simulated workload (``air-hpc fleet simulate``) against its ground truth and against sacct.

A testbed of its own with tenants and QOS preemption; the workload's trainings write run records under one
root, which the report joins. The truth counts what the workload itself saw (its runs' starts and
``preempted`` events, the failures it injected), sacct what Slurm accounted.
"""

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from air_hpc.testbed import Testbed
from air_hpc.testbed.conf import Settings
from tests.integration.test_fleet_testbed import first_waits, node_seconds, sacct_says
from tests.integration.test_jobs_testbed import AIR_HPC

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    shared = os.environ.get("AIR_HPC_TEST_STATE_DIR")
    state_dir = Path(f"{shared}-f") if shared else tmp_path_factory.mktemp("fleet")
    testbed = Testbed(state_dir)
    testbed.up((2, 2), settings=Settings(tenants=True, preempt_by="qos"))
    try:
        yield SimpleNamespace(testbed=testbed, env=testbed.env, client=testbed.client(), state_dir=state_dir)
    finally:
        testbed.down()


def air_hpc(bed: SimpleNamespace, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **bed.env}
    return subprocess.run([AIR_HPC, *args], env=env, capture_output=True, text=True, timeout=900)


def test_report_of_a_simulated_workload_matches_its_ground_truth_and_sacct(
    bed: SimpleNamespace, tmp_path: Path
) -> None:
    truth_path, runs = tmp_path / "truth.json", tmp_path / "runs"
    since_s = time.time() - 2
    result = air_hpc(
        bed,
        "fleet",
        "simulate",
        "--jobs",
        "8",
        "--seed",
        "3",
        "--out",
        str(truth_path),
        "--root",
        str(runs),
        "--state-dir",
        str(bed.state_dir),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    truth = json.loads(truth_path.read_text())
    time.sleep(3)  # accounting lags the controller
    result = air_hpc(
        bed,
        "fleet",
        "report",
        "--since",
        f"{since_s:.0f}",
        "--until",
        f"{time.time():.0f}",
        "--root",
        str(runs),
        "--json",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    tenants = {t["account"]: t for t in report["tenants"]}
    assert set(tenants) == set(truth["totals"])
    for account, expected in truth["totals"].items():
        got = tenants[account]
        assert (got["jobs"], got["preemptions"], got["requeues"]) == (
            expected["jobs"],
            expected["preemptions"],
            expected["requeues"],
        ), account
        assert got["failures"] == expected["failures"], account  # the injected crash, exit 3 and user's cancel
    ours = sum(1 for job in truth["jobs"] if job["run_dir"])
    assert report["total"]["jobs_with_records"] == ours > 0
    since, until = report["window"]["since_s"], report["window"]["until_s"]
    rows = sacct_says(bed, since, until)
    assert {a: t["node_seconds"] for a, t in tenants.items()} == pytest.approx(node_seconds(rows, since, until))
    waits = first_waits(rows, since, until)
    assert report["total"]["queue_wait_s"]["max"] == max(waits)
    truth_waits = [job["start_s"] - job["submit_s"] for job in truth["jobs"] if job["start_s"] is not None]
    assert max(waits) == pytest.approx(max(truth_waits), abs=2.5)  # Slurm's times are whole seconds
