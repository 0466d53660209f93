"""The embedded testbed is a real multi-node Slurm: placement, hostnames, accounting, clean shutdown."""

import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from air_hpc.errors import TestbedError
from air_hpc.slurm.client import ONCE
from air_hpc.slurm.jobs import JobState
from air_hpc.testbed import Testbed
from tests.integration.waiting import wait_ended, wait_for

pytestmark = pytest.mark.integration


def sbatch(testbed, *args: str) -> str:
    return testbed.client.run(["sbatch", "--parsable", *args], retry=ONCE).stdout.strip().split(";")[0]


def test_up_brings_eight_idle_nodes(testbed) -> None:
    status = testbed.testbed.status()
    assert status["up"]
    assert status["nodes"] == {f"n{i}": "idle" for i in range(1, 9)}
    assert "SwitchName=leaf2 Nodes=n[3-6]" in testbed.topology_conf.read_text()


def test_up_twice_is_safe(testbed) -> None:
    before = testbed.testbed.status()["daemons"]
    build = testbed.testbed.build
    again = Testbed(testbed.state_dir).up((2, 4, 2), slurm_prefix=build.prefix if build else None)
    assert again["daemons"] == before
    assert again["slurm_version"] == str(testbed.client.version())
    if build is not None:  # the same testbed asked for another Slurm is refused, not restarted
        with pytest.raises(TestbedError, match=f"already up with Slurm {build.version} from {build.prefix}"):
            Testbed(testbed.state_dir).up((2, 4, 2))


def test_switches_one_lands_on_the_four_node_leaf(testbed, tmp_path: Path) -> None:
    out = tmp_path / "out"
    job = sbatch(testbed, "-N4", "--switches=1", "-o", str(out), "--wrap", "echo $SLURM_JOB_NODELIST")
    assert testbed.wait_job(job) == "COMPLETED"
    assert out.read_text().strip() == "n[3-6]"


def test_two_node_job_sees_its_own_hostnames(testbed, tmp_path: Path) -> None:
    out = tmp_path / "hosts.out"
    job = sbatch(
        testbed,
        "-N2",
        "--ntasks-per-node=1",
        "-o",
        str(out),
        "--wrap",
        "srun bash -c 'echo $SLURM_NODEID $(hostname) $SLURMD_NODENAME'",
    )
    assert testbed.wait_job(job) == "COMPLETED"
    lines = sorted(out.read_text().split("\n")[:-1])
    assert len(lines) == 2
    for line in lines:
        _, hostname, nodename = line.split()
        assert hostname == nodename
    assert len({line.split()[1] for line in lines}) == 2


def test_peers_resolve_to_loopback_inside_jobs(testbed, tmp_path: Path) -> None:
    out = tmp_path / "resolve.out"
    job = sbatch(testbed, "-N1", "-w", "n3", "-o", str(out), "--wrap", "getent hosts n7")
    assert testbed.wait_job(job) == "COMPLETED"
    assert out.read_text().split()[0] == "127.0.0.1"


def test_sacct_shows_finished_job(testbed, tmp_path: Path) -> None:
    job = sbatch(testbed, "-N1", "-o", str(tmp_path / "out"), "--wrap", "exit 3")
    assert testbed.wait_job(job) == "FAILED"
    out = testbed.client.run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "JobID,State,ExitCode"]).stdout
    assert out.strip() == f"{job}|FAILED|3:0"


def test_status_json_and_env_cli(testbed) -> None:
    cli = [sys.executable, "-m", "air_hpc", "testbed"]
    status = json.loads(
        subprocess.run(
            [*cli, "status", "--json", "--state-dir", str(testbed.state_dir)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert status["up"] and len(status["nodes"]) == 8
    assert all(d["alive"] for d in status["daemons"].values())
    env = subprocess.run(
        [*cli, "env", "--state-dir", str(testbed.state_dir)], capture_output=True, text=True, check=True
    ).stdout
    build = testbed.testbed.build
    path = [f"export PATH={shlex.quote(testbed.env['PATH'])}"] if build else []  # a build's commands first
    assert env.splitlines() == [*path, f"export SLURM_CONF={testbed.state_dir}/etc/slurm.conf"]
    assert status["slurm_version"] == str(build.version if build else testbed.client.version())


def test_second_testbed_side_by_side_and_down_leaves_no_daemon(testbed, tmp_path: Path) -> None:
    other = Testbed(tmp_path / "other")
    status = other.up((1, 1))
    try:
        assert status["nodes"] == {"n1": "idle", "n2": "idle"}
        assert set(status["ports"]["slurmd"]).isdisjoint(testbed.testbed.status()["ports"]["slurmd"])
        pids = [d["pid"] for d in status["daemons"].values()]
    finally:
        stopped = other.down()
    assert len(stopped) == len(pids)
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert testbed.testbed.status()["up"], "bringing the second testbed down must not touch the first"
    assert other.status()["up"] is False


def start_a_long_step(bed: Testbed, tmp_path: Path, name: str, until: Path | None = None) -> str:
    """A two-node job whose step runs until ``until`` exists (else 600 s); returns its job id once the step runs."""
    marker = tmp_path / f"{name}-started"
    wait = f"until [ -e {until} ]; do sleep 0.2; done" if until else "exec sleep 600"
    step = f"srun bash -c 'touch {marker}; {wait}'; touch {tmp_path / name}-ended"
    job_id = (
        bed.client()
        .run(["sbatch", "--parsable", "-N2", "-o", str(tmp_path / name), "--wrap", step], retry=ONCE)
        .stdout.strip()
    )
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert time.monotonic() < deadline, "the job step never started"
        time.sleep(0.2)
    names = {p.name() for p in bed.node_processes()}
    assert {"slurmd", "slurmstepd", "sleep" if until is None else "bash"} <= names, names
    return job_id


def daemon_pids(bed: Testbed) -> dict[str, int]:
    return {name: daemon["pid"] for name, daemon in bed.status()["daemons"].items()}


def kill_daemons(bed: Testbed, names: set[str]) -> None:
    procs = [psutil.Process(pid) for name, pid in daemon_pids(bed).items() if name in names]
    for proc in procs:
        proc.send_signal(signal.SIGKILL)
    psutil.wait_procs(procs, timeout=10)


def test_down_stops_job_steps_and_up_restarts_only_the_slurmds_that_died_mid_job(testbed, tmp_path: Path) -> None:
    """slurmstepd leaves slurmd's process tree: a killed slurmd used to orphan it and make ``up`` hang. ``up`` starts
    the dead slurmds again, and only them: the job they ran runs on (issue 27 item 9)."""
    other = Testbed(tmp_path / "busy")
    other.up((1, 1))
    try:
        job_id = start_a_long_step(other, tmp_path, "first")
        before = daemon_pids(other)
        kill_daemons(other, {"slurmd-n1", "slurmd-n2"})  # the job's slurmstepd processes are orphaned
        status = other.up((1, 1), timeout_s=60)  # partly running: the slurmds start again
        after = daemon_pids(other)
        assert {name for name in before if after[name] != before[name]} == {"slurmd-n1", "slurmd-n2"}
        assert set(status["nodes"]) == {"n1", "n2"} and set(status["nodes"].values()) <= {"allocated", "mixed"}
        job = other.client().job_status(job_id)
        assert job is not None and job.state is JobState.RUNNING
        other.client().scancel(job_id)
        assert wait_ended(other.client(), job_id, 60).state is JobState.CANCELLED
        start_a_long_step(other, tmp_path, "second")
        other.down()
        assert other.node_processes() == []  # no slurmstepd, no task of this testbed is left
        assert other.up((1, 1))["up"]
    finally:
        other.down()
    assert other.node_processes() == []
    assert testbed.testbed.status()["up"], "the session's testbed is untouched"


def test_up_after_slurmctld_died_restarts_it_alone_and_cancels_no_job(testbed, tmp_path: Path) -> None:
    """A job that finished while the controller was down ends COMPLETED, one still running runs on (issue 27
    item 9: ``up`` restarted every daemon and cancelled every job of the user)."""
    other = Testbed(tmp_path / "half")
    other.up((2, 2))
    try:
        client = other.client()
        finishing = start_a_long_step(other, tmp_path, "finishing", until=tmp_path / "finish")
        running = start_a_long_step(other, tmp_path, "running", until=tmp_path / "release")
        # A killed slurmctld forgets what it had not saved yet: kill it once its saved state has both jobs running.
        both_running = time.time()
        saved = other.layout.ctld_state / "job_state"
        wait_for("slurmctld to save its jobs", lambda: saved.stat().st_mtime > both_running, 60, 0.2)
        before = daemon_pids(other)
        kill_daemons(other, {"slurmctld"})
        (tmp_path / "finish").touch()  # its step ends with exit 0 while no controller listens
        wait_for("the finishing job's step to end", (tmp_path / "finishing-ended").exists, 30, 0.2)
        status = other.up((2, 2), timeout_s=60)
        after = daemon_pids(other)
        assert {name for name in before if after[name] != before[name]} == {"slurmctld"}
        assert set(status["nodes"].values()) <= {"allocated", "idle", "completing", "mixed"}, status["nodes"]
        assert wait_ended(client, finishing, 60).state is JobState.COMPLETED
        job = client.job_status(running)
        assert job is not None and job.state is JobState.RUNNING
        (tmp_path / "release").touch()
        assert wait_ended(client, running, 60).state is JobState.COMPLETED
    finally:
        other.down()
    assert testbed.testbed.status()["up"], "the session's testbed is untouched"
