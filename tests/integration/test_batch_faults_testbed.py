"""Faults aimed at the batch script itself on the real testbed: a second sbatch of a run's own script, a SIGTERM
to the batch shell, a user signal the moment the job starts.

The batch scripts are the real rendered template with the real supervisor; only the training step is a
small payload, so each job takes seconds.
"""

import hashlib
import sys
from pathlib import Path
from typing import Any

import hostlist
import pytest

from air_hpc.config import load_job
from air_hpc.launch.submit import Submission, submit
from air_hpc.records.rundir import RunDir
from air_hpc.slurm.jobs import JobState
from tests.integration.test_jobs_testbed import TESTBED_JOB, wait_ready, wait_state

pytestmark = pytest.mark.integration

#: argv: RUN_DIR. Each rank reads the rank order srun was given, says it is ready, waits for ``release``
#: in the run directory, and exits 0 only if the rank order it reads then is the one it started with.
HOLD = """
import os, socket, sys, time
from pathlib import Path

run_dir = Path(sys.argv[1])
rank = os.environ["SLURM_PROCID"]
hostfile = Path(os.environ["SLURM_HOSTFILE"])
before = hostfile.read_text()
(run_dir / f"ready-0-{rank}").touch()
deadline = time.monotonic() + 120
while not (run_dir / "release").exists() and time.monotonic() < deadline:
    time.sleep(0.1)
after = hostfile.read_text()
print(f"rank {rank} on {socket.gethostname()}: rank order {'kept' if after == before else 'CHANGED'}", flush=True)
sys.exit(0 if after == before and socket.gethostname() in after.split() else 3)
"""


def submit_step(testbed: Any, tmp_path: Path, source: str, name: str, *overrides: str) -> Submission:
    payload = tmp_path / f"{name}-payload.py"
    payload.write_text(source)
    job = load_job(
        TESTBED_JOB,
        [f"run.root={tmp_path}", f"run.name={name}", f"cluster.topology_file={testbed.topology_conf}", *overrides],
    )
    return submit(job, "slurm", testbed.client, step_command=[sys.executable, str(payload), str(job.run.dir)])


def snapshot(run: RunDir, skip: set[Path]) -> dict[str, str]:
    """Every file of the run directory and a hash of its content."""
    return {
        str(p.relative_to(run.path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run.path.rglob("*"))
        if p.is_file() and p not in skip
    }


def test_a_second_sbatch_of_the_runs_own_script_writes_nothing_and_the_owner_runs_on(
    testbed: Any, tmp_path: Path
) -> None:
    owner = submit_step(testbed, tmp_path, HOLD, "owned")
    run = RunDir(owner.run_dir)
    wait_ready(run.path, 4)
    pinned = hostlist.expand_hostlist(owner.plan.request.nodelist)
    others = [n for n in testbed.nodes if n not in pinned][-2:]
    before = snapshot(run, set())
    answer = testbed.client.run(["sbatch", "--parsable", f"--nodelist={','.join(others)}", str(run.sbatch)])
    intruder = answer.stdout.strip().split(";")[0]
    assert wait_state(testbed, intruder) is JobState.FAILED
    refused = (run.logs / f"slurm-{intruder}.err").read_text()
    assert f"belongs to job {owner.job_id}, not to this job {intruder}: exiting before writing anything" in refused
    assert snapshot(run, set(run.batch_logs(intruder))) == before, "the intruder wrote in the run directory"
    (run.path / "release").touch()
    assert wait_state(testbed, owner.job_id) is JobState.COMPLETED, (run.logs / f"slurm-{owner.job_id}.out").read_text()
    out = (run.logs / f"slurm-{owner.job_id}.out").read_text()
    assert out.count("rank order kept") == 4, out
