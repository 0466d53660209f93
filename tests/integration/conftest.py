"""One real Slurm testbed for the whole session (nodes n1..n8 on leaves 2,4,2).

Debian's Slurm by default; ``AIR_HPC_SLURM_PREFIX=PREFIX`` runs a build of another release instead.
"""

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from air_hpc.slurm.client import SlurmClient
from air_hpc.testbed import Testbed
from tests.integration.matrix import matrix_build


@dataclass
class RunningTestbed:
    state_dir: Path
    env: dict[str, str]
    client: SlurmClient
    nodes: list[str]
    topology_conf: Path
    testbed: Testbed = field(repr=False)

    def wait_job(self, job_id: str, states: tuple[str, ...] = ("COMPLETED",), timeout_s: float = 120) -> str:
        """Poll sacct (it lags the controller by about a second) until the job reaches a final state."""
        final = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"}
        deadline = time.monotonic() + timeout_s
        state = ""
        while time.monotonic() < deadline:
            out = self.client.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], check=False).stdout
            state = out.strip().splitlines()[-1].split()[0] if out.strip() else ""
            if state in final or state in states:
                return state
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} did not finish in {timeout_s} s (last state {state!r})")


@pytest.fixture(scope="session")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningTestbed]:
    state_dir = Path(os.environ.get("AIR_HPC_TEST_STATE_DIR") or tmp_path_factory.mktemp("testbed"))
    bed = Testbed(state_dir)
    build = matrix_build()
    status = bed.up((2, 4, 2), slurm_prefix=build.prefix if build else None)
    try:
        yield RunningTestbed(
            state_dir=bed.layout.root,
            env=bed.env,
            client=bed.client(),
            nodes=list(status["nodes"]),
            topology_conf=bed.layout.topology_conf,
            testbed=bed,
        )
    finally:
        bed.down()


@pytest.fixture(autouse=True)
def idle_testbed_after(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each testbed test leaves the cluster idle: a job a failed test left behind would hold nodes the next
    test's placement counts on, turning one failure into several."""
    yield
    if "testbed" not in request.fixturenames:
        return
    client: SlurmClient = request.getfixturevalue("testbed").client
    deadline = time.monotonic() + 60
    while job_ids := client.run(["squeue", "-h", "-o", "%i"], check=False).stdout.split():
        for job_id in job_ids:
            client.run(["scancel", job_id], check=False)
        if time.monotonic() > deadline:
            raise AssertionError(f"testbed jobs {job_ids} still in the queue 60 s after scancel")
        time.sleep(0.5)
