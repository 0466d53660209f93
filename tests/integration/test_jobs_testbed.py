"""Render, submit, follow, requeue and cancel real jobs on the Slurm testbed.

The batch scripts are the real rendered template; only the training step is
replaced by a small payload (``PAYLOAD``) so each job takes seconds. Run
directories live under tmp_path, which every emulated node shares.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import hostlist
import pytest
import submitit

from air_hpc.config import load_job
from air_hpc.exitcodes import ExitCode
from air_hpc.launch.executors import submitit_slurm_parameters
from air_hpc.launch.submit import Submission, plan, submit
from air_hpc.ops.control import run_status
from air_hpc.ownership.owner import RunBusyError, read_owner
from air_hpc.records.jsonl import read_jsonl
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import record_submission
from air_hpc.slurm.jobs import JobState
from tests.integration.waiting import wait_ended, wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
JOBS = sorted((REPO / "configs" / "jobs").glob("*.yaml"))
TESTBED_JOB = REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml"
AIR_HPC = str(REPO / ".venv" / "bin" / "air-hpc")

#: argv: MODE RUN_DIR REQUEUE_CODE. quick: print and exit 0; wait: wait for USR2 (or TERM);
#: requeue: on the first start wait for USR2 and exit REQUEUE_CODE, on a restart exit 0.
PAYLOAD = """
import os, signal, socket, sys, time
from pathlib import Path
from air_hpc.records.generation import generation, generation_dir
from air_hpc.records.rundir import RunDir

mode, run_dir, requeue_code = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
rank = os.environ["SLURM_PROCID"]
print(f"rank {rank} on {socket.gethostname()} restart {restart}", flush=True)
if mode == "quick" or (mode == "requeue" and restart > 0):
    sys.exit(0)
got = []
signal.signal(signal.SIGUSR2, lambda *_: got.append(1))
# The supervisor forwards a stop to armed ranks, in this step attempt's directory.
armed = generation_dir(RunDir(run_dir), generation(os.environ))
armed.mkdir(parents=True, exist_ok=True)
(armed / f"armed-{rank}").touch()
(run_dir / f"ready-{restart}-{rank}").touch()
deadline = time.monotonic() + 120
while time.monotonic() < deadline and not got:
    time.sleep(0.05)
print(f"rank {rank} got USR2", flush=True)
sys.exit(requeue_code if got else 1)
"""


class Entry:
    """A picklable stand-in for TrainingEntry under submitit: reports where each rank ran."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def __call__(self) -> tuple[str, str]:
        return os.environ["SLURM_PROCID"], socket.gethostname()


@pytest.fixture
def payload(tmp_path: Path) -> Path:
    path = tmp_path / "payload.py"
    path.write_text(PAYLOAD)
    return path


def cli(testbed: Any, *args: str, conf: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **testbed.env}
    if conf is not None:
        env["SLURM_CONF"] = str(conf)
    return subprocess.run([AIR_HPC, *args], env=env, capture_output=True, text=True, timeout=120)


def submit_payload(testbed: Any, tmp_path: Path, payload: Path, mode: str, name: str, *overrides: str) -> Submission:
    job = load_job(TESTBED_JOB, [f"run.root={tmp_path}", f"run.name={name}", *overrides])
    command = [sys.executable, str(payload), mode, str(job.run.dir), str(int(ExitCode.REQUEUE))]
    return submit(job, "slurm", testbed.client, step_command=command)


def wait_ready(run_dir: Path, ranks: int, restart: int = 0) -> None:
    wait_for(f"{ranks} ranks to start", lambda: len(list(run_dir.glob(f"ready-{restart}-*"))) == ranks, 60, 0.3)


def wait_state(testbed: Any, job_id: str, timeout_s: float = 90) -> JobState:
    return wait_ended(testbed.client, job_id, timeout_s, poll_s=0.3).state


#: Examples for hardware the testbed has (CPU nodes); the GPU ones are checked by their rendered goldens.
CPU_JOBS = [job for job in JOBS if load_job(job).hardware.device == "cpu"]


@pytest.mark.parametrize("job_file", CPU_JOBS, ids=lambda p: p.stem)
def test_every_example_passes_sbatch_test_only(
    testbed: Any, tmp_path: Path, job_file: Path, small_corpus: Path
) -> None:
    job = load_job(job_file, [f"run.root={tmp_path}", f"data.path={small_corpus}"])
    planned = plan(job, testbed.client, test_only=True)
    assert planned.test_only is not None, planned.notes
    assert hostlist.expand_hostlist(planned.test_only.nodelist)


def test_two_node_job_runs_and_status_and_logs_follow_it(testbed: Any, tmp_path: Path, payload: Path) -> None:
    done = submit_payload(
        testbed, tmp_path, payload, "quick", "two-node", f"cluster.topology_file={testbed.topology_conf}"
    )
    pinned = hostlist.expand_hostlist(done.plan.request.nodelist)
    assert len(pinned) == 2 and len(done.plan.request.rank_hosts) == 4

    states: list[str] = []

    def completed() -> bool:
        result = cli(testbed, "status", str(done.run_dir), "--json")
        assert result.returncode == 0, result.stderr
        states.append(json.loads(result.stdout)["state"])
        return states[-1] == "COMPLETED"

    wait_for("status to report COMPLETED", completed, 60, 0.3)
    result = cli(testbed, "status", str(done.run_dir))
    assert "COMPLETED" in result.stdout and done.job_id in result.stdout

    logs = cli(testbed, "logs", str(done.run_dir))
    assert logs.returncode == 0, logs.stderr
    for host in pinned:
        assert f"on {host} restart 0" in logs.stdout, logs.stdout
    rank0 = cli(testbed, "logs", str(done.run_dir), "--rank", "0")
    assert rank0.stdout.splitlines() == [
        f"==> logs/slurm-{done.job_id}.out <==",
        f"0: rank 0 on {done.plan.request.rank_hosts[0]} restart 0",
    ]
    beyond = cli(testbed, "logs", str(done.run_dir), "--rank", "9")
    assert beyond.returncode == 2 and "--rank 9: run two-node has 4 ranks (0-3)" in beyond.stderr

    listed = cli(testbed, "runs", "--root", str(tmp_path), "--json")
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)["runs"]
    assert (row["name"], row["state"], row["job_id"]) == ("two-node", "COMPLETED", done.job_id)
    watched = cli(testbed, "status", str(done.run_dir), "--watch")
    assert watched.returncode == 0 and watched.stdout.startswith(f"two-node job {done.job_id}: COMPLETED")


def test_usr2_to_the_batch_shell_requeues_once_then_completes(testbed: Any, tmp_path: Path, payload: Path) -> None:
    done = submit_payload(testbed, tmp_path, payload, "requeue", "requeue", "resilience.max_restarts=1")
    wait_ready(done.run_dir, 4)
    testbed.client.scancel(done.job_id, signal="USR2", batch=True)
    assert wait_state(testbed, done.job_id) is JobState.COMPLETED

    starts = [r for r in read_jsonl(RunDir(done.run_dir).submissions) if r.get("kind") == "started"]
    assert [(r["job_id"], r["restart_count"]) for r in starts] == [(done.job_id, 0), (done.job_id, 1)]
    status = run_status(RunDir(done.run_dir), testbed.client)
    assert status.job.state is JobState.COMPLETED and status.restarts == 1
    out = (RunDir(done.run_dir).logs / f"slurm-{done.job_id}.out").read_text()
    assert out.count("got USR2") == 4 and out.count("restart 1") == 4


def test_cancel_ends_a_running_job(testbed: Any, tmp_path: Path, payload: Path) -> None:
    done = submit_payload(testbed, tmp_path, payload, "wait", "cancel")
    wait_ready(done.run_dir, 4)
    result = cli(testbed, "cancel", str(done.run_dir))
    assert result.returncode == 0 and f"cancelled job {done.job_id}" in result.stdout
    assert wait_state(testbed, done.job_id, 30) is JobState.CANCELLED


def test_cancel_of_a_completed_job_cancels_nothing_and_says_so(testbed: Any, tmp_path: Path, payload: Path) -> None:
    done = submit_payload(testbed, tmp_path, payload, "quick", "done-early")
    assert wait_state(testbed, done.job_id) is JobState.COMPLETED
    result = cli(testbed, "cancel", str(done.run_dir))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"job {done.job_id} (slurm) had already ended: COMPLETED; nothing to cancel\n"
    data = json.loads(cli(testbed, "cancel", str(done.run_dir), "--json").stdout)
    assert (data["cancelled"], data["state"]) == (False, "COMPLETED")
    assert run_status(RunDir(done.run_dir), testbed.client).job.state is JobState.COMPLETED


def test_hostile_job_name_reaches_slurm_verbatim(testbed: Any, tmp_path: Path, small_corpus: Path) -> None:
    name = 'x"; touch pwned; echo " #$(id) `id` it\'s'
    job = load_job(TESTBED_JOB, [f"run.root={tmp_path}", "placement.topology_aware=false", f"data.path={small_corpus}"])
    job = job.model_copy(update={"run": job.run.model_copy(update={"name": name})})
    planned = plan(job, None)
    script = tmp_path / "hostile.sbatch"
    script.write_text(planned.script)
    RunDir.of(job).logs.mkdir(parents=True)
    job_id = testbed.client.sbatch(script, ["--hold"])
    try:
        (record,) = testbed.client.squeue([job_id])
        assert record.name == name
        shown = testbed.client.run(["scontrol", "show", "job", job_id]).stdout
        assert f"StdOut={RunDir.of(job).logs}/slurm-{job_id}.out" in shown
    finally:
        testbed.client.scancel(job_id)
    assert not list(tmp_path.rglob("pwned")) and not Path("pwned").exists()


def test_hostile_job_name_reaches_slurm_verbatim_through_submitit_too(testbed: Any, tmp_path: Path) -> None:
    """submitit's script carries the same request, quoted its own way: sbatch
    reads the same name back from it."""
    name = 'x"; touch pwned; echo " #$(id) `id` it\'s'
    job = load_job(TESTBED_JOB, [f"run.root={tmp_path}", "placement.topology_aware=false"])
    job = job.model_copy(update={"run": job.run.model_copy(update={"name": name})})
    executor = submitit.SlurmExecutor(folder=tmp_path / "submitit")
    executor.update_parameters(**submitit_slurm_parameters(plan(job, None), RunDir(tmp_path)))
    script = tmp_path / "submitit.sbatch"
    script.write_text(executor._make_submission_file_text("true", "uid"))
    job_id = testbed.client.sbatch(script, ["--hold"])
    try:
        (record,) = testbed.client.squeue([job_id])
        assert record.name == name
    finally:
        testbed.client.scancel(job_id)
    assert not list(tmp_path.rglob("pwned")) and not Path("pwned").exists()


def test_submitit_executor_runs_on_the_testbed(
    testbed: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_corpus: Path
) -> None:
    # submitit runs sbatch itself with this process's environment, not through our client.
    for key, value in testbed.env.items():  # SLURM_CONF, and PATH on a Slurm build
        monkeypatch.setenv(key, value)
    job = load_job(TESTBED_JOB, [f"run.root={tmp_path}", "run.name=submitit", f"data.path={small_corpus}"])
    done = submit(job, "submitit", testbed.client, entry=Entry)
    assert wait_state(testbed, done.job_id, 90) is JobState.COMPLETED
    assert (done.run_dir / "submitit").is_dir()
    assert run_status(RunDir(done.run_dir), testbed.client).job.state is JobState.COMPLETED


def test_status_with_controller_down_is_one_line_and_nonzero(testbed: Any, tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    conf_text = Path(testbed.env["SLURM_CONF"]).read_text()
    lines = [line for line in conf_text.splitlines() if not line.startswith(("SlurmctldPort=", "MessageTimeout="))]
    down = tmp_path / "slurm.conf"
    down.write_text("\n".join([*lines, f"SlurmctldPort={closed_port}", "MessageTimeout=2", ""]))
    run = RunDir(tmp_path / "run")
    record_submission(run, "1", "slurm")
    result = cli(testbed, "status", str(run.path), conf=down)
    assert result.returncode == ExitCode.UNREACHABLE
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: Slurm controller unreachable")


def test_one_live_job_per_run_directory(testbed: Any, tmp_path: Path, payload: Path) -> None:
    first = submit_payload(testbed, tmp_path, payload, "wait", "owned")
    run = RunDir(first.run_dir)
    script = run.sbatch.read_text()
    with pytest.raises(RunBusyError, match=rf"job {first.job_id} \(slurm\) still owns this run directory"):
        submit_payload(testbed, tmp_path, payload, "quick", "owned")
    assert run.sbatch.read_text() == script
    # A job that bypasses submit (sbatch of a copy of the script with the real training step) is
    # fenced off by its ranks before they write anything.
    rogue_script = tmp_path / "rogue.sbatch"
    rogue_script.write_text(plan(load_job(run.job_json), None, python=sys.executable).script)
    rogue = testbed.client.sbatch(rogue_script)
    wait_ready(run.path, 4)
    assert wait_state(testbed, rogue) is JobState.FAILED
    fenced = (run.logs / f"slurm-{rogue}.err").read_text()
    assert f"belongs to job {first.job_id}, not to this job {rogue}: exiting before writing anything" in fenced
    assert not list(run.logs.glob("rank-*.log"))
    assert not run.metrics.exists() and not run.checkpoints.exists() and not (run.heartbeat / f"{rogue}-0").exists()
    testbed.client.scancel(first.job_id)
    assert wait_state(testbed, first.job_id, 30) is JobState.CANCELLED
    second = submit_payload(testbed, tmp_path, payload, "quick", "owned")  # the ended owner's claim is stale
    assert wait_state(testbed, second.job_id) is JobState.COMPLETED
    owner = read_owner(run)
    assert owner is not None and owner.job_id == second.job_id


def test_a_submit_while_the_nodes_are_drained_queues_with_a_note(testbed: Any, tmp_path: Path, payload: Path) -> None:
    """slurmctld refuses --test-only for drained nodes but queues the job: submit queues it and says why."""
    drained = [f"n{i}" for i in range(2, 9)]
    testbed.client.run(["scontrol", "update", f"nodename={','.join(drained)}", "state=drain", "reason=air-hpc-test"])
    try:
        done = submit_payload(testbed, tmp_path, payload, "quick", "drained", "placement.topology_aware=false")
        assert done.plan.test_only is None
        assert (
            "the job waits in the queue (ReqNodeNotAvail) until 1 more node(s) return to service" in done.plan.notes[-1]
        )
        assert "n2 (idle+drain)" in done.plan.notes[-1]
        status = testbed.client.job_status(done.job_id)
        assert status is not None and status.state is JobState.PENDING
    finally:
        testbed.client.run(["scontrol", "update", f"nodename={','.join(drained)}", "state=resume"])
    assert wait_state(testbed, done.job_id) is JobState.COMPLETED
