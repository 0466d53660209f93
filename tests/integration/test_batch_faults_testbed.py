"""Faults aimed at the batch script itself on the real testbed: a second sbatch of a run's own script, a SIGTERM
to the batch shell, a user signal the moment the job starts.

The batch scripts are the real rendered template with the real supervisor; only the training step is a
small payload, so each job takes seconds.
"""

import contextlib
import hashlib
import signal
import sys
import time
from pathlib import Path
from typing import Any

import hostlist
import psutil
import pytest

from air_hpc.config import load_job
from air_hpc.launch.submit import Submission, submit
from air_hpc.records.events import read_events
from air_hpc.records.rundir import RunDir
from air_hpc.slurm.jobs import JobState
from tests.integration.test_jobs_testbed import TESTBED_JOB, wait_ready, wait_state
from tests.integration.waiting import wait_for

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


#: argv: RUN_DIR. A rank as the trainer arms (stop signals held from its first line, then handled and
#: announced in its step attempt's directory): on the first start it runs until a stop and exits with the
#: requeue code, as after a save; on a restart it exits 0.
STOPPABLE = """
from air_hpc.resilience.signals import StopRequest, hold_stop_signals

hold_stop_signals()
import os, sys, time
from pathlib import Path
from air_hpc.records.generation import generation, generation_dir
from air_hpc.records.events import read_events
from air_hpc.records.rundir import RunDir

run_dir = Path(sys.argv[1])
rank = int(os.environ["SLURM_PROCID"])
restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
print(f"rank {rank} start {restart}", flush=True)
if restart:
    sys.exit(0)
stop = StopRequest.install(["USR2", "TERM", "INT", "HUP"])
stop.announce_armed(generation_dir(RunDir(run_dir), generation(os.environ)), rank, "USR2")
(run_dir / f"ready-0-{rank}").touch()
# The trainer's stop: all ranks agree at a step boundary, so a rank that alone found the shell's record (armed
# after it) stops the others too, and none leaves before all know (srun would end the rest with SIGTERM).
agreed = run_dir / "stop-agreed"
deadline = time.monotonic() + 60
while not stop.requested and not agreed.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
if stop.requested and not agreed.exists():
    (run_dir / f".agreed-{rank}").write_text(str(stop.signal_name))
    os.replace(run_dir / f".agreed-{rank}", agreed)
name = stop.signal_name or (agreed.read_text() if agreed.exists() else None)
(run_dir / f"stopped-{rank}").write_text(str(name))
everyone = time.monotonic() + 30
while name and len(list(run_dir.glob("stopped-*"))) < int(os.environ["SLURM_NTASKS"]) and time.monotonic() < everyone:
    time.sleep(0.05)
sys.exit(85 if name else 0)
"""


def batch_shell(testbed: Any, job_id: str) -> psutil.Process:
    """The job's batch script process (slurmstepd runs ``slurm_script`` from the node's spool)."""
    found: list[psutil.Process] = []

    def running() -> bool:
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                script = "".join(proc.cmdline()[-1:]).endswith("slurm_script")
                if script and proc.environ().get("SLURM_JOB_ID") == job_id:
                    found.append(proc)
                    return True
        return False

    wait_for(f"job {job_id}'s batch shell", running, 60, 0.02)
    return found[0]


def wait_running(testbed: Any, job_id: str) -> None:
    def running() -> bool:
        status = testbed.client.job_status(job_id)
        return status is not None and status.state is JobState.RUNNING

    wait_for(f"job {job_id} to run", running, 60, 0.05)


def check_stopped_and_requeued(
    testbed: Any, run: RunDir, job_id: str, signal_name: str, ranks_ran: bool | None
) -> None:
    """The job was requeued once and completed; if its ranks ran (None: either way), every one of them stopped on
    the stop signal and asked for the requeue, as after a save. The batch shell recorded the signal it got."""
    err = run.logs / f"slurm-{job_id}.err"
    assert wait_state(testbed, job_id, 180) is JobState.COMPLETED, err.read_text()
    stopped = sorted(p.read_text() for p in run.path.glob("stopped-*"))
    saved = ["SIGUSR2"] * 4
    expected: list[list[str]] = [saved] if ranks_ran else [[]] if ranks_ran is False else [[], saved]
    assert stopped in expected, err.read_text()
    assert (run.logs / f"slurm-{job_id}.out").read_text().count("start 1") == 4
    status = testbed.client.job_status(job_id)
    assert status is not None and status.restarts == 1
    assert [e["signal"] for e in read_events(run.events) if e["kind"] == "signal"] == [signal_name]


@pytest.mark.parametrize("when", ["first-second", "mid-step"])
def test_sigterm_to_the_batch_shell_is_a_stop_that_saves_and_requeues(testbed: Any, tmp_path: Path, when: str) -> None:
    """``kill -TERM`` of the batch script (issue 27 item 6): as any stop, the ranks save and the job requeues."""
    done = submit_step(testbed, tmp_path, STOPPABLE, "term", "resilience.max_restarts=1")
    shell = batch_shell(testbed, done.job_id)
    if when == "mid-step":
        wait_ready(done.run_dir, 4)
    shell.send_signal(signal.SIGTERM)
    check_stopped_and_requeued(testbed, RunDir(done.run_dir), done.job_id, "SIGTERM", when == "mid-step")


@pytest.mark.parametrize("after_s", [0.0, 0.6])
def test_a_user_signal_the_moment_the_job_runs_is_acted_on(testbed: Any, tmp_path: Path, after_s: float) -> None:
    """``scancel --signal=USR2 --batch`` just after RUNNING (issue 27 item 7) is not lost: the ranks save, the job
    requeues once and completes."""
    done = submit_step(testbed, tmp_path, STOPPABLE, "usr2", "resilience.max_restarts=1")
    wait_running(testbed, done.job_id)
    time.sleep(after_s)  # the moment of the fault, not a wait for something to happen
    testbed.client.scancel(done.job_id, signal="USR2", batch=True)
    check_stopped_and_requeued(testbed, RunDir(done.run_dir), done.job_id, "SIGUSR2", None)
