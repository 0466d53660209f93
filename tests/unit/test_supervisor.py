"""Hot spares: choosing them, rendering them, and the in-job supervisor around a stand-in srun."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import psutil
import pytest

from air_hpc.cli.main import cli
from air_hpc.config import load_job
from air_hpc.errors import ConfigError
from air_hpc.exitcodes import ExitCode
from air_hpc.health.badnodes import read_bad_nodes
from air_hpc.launch.submit import plan
from air_hpc.records.events import read_events
from air_hpc.records.rundir import RunDir
from air_hpc.runtime.supervisor import (
    StepResult,
    Supervisor,
    TaskFailure,
    block_order,
    failed_nodes,
    parse_task_failure,
    replace_nodes,
)
from air_hpc.slurm.client import SlurmClient
from air_hpc.slurm.fake import FakeSlurm
from air_hpc.topology import treeconf
from air_hpc.topology.select import pick_spare, select_spares

REPO = Path(__file__).resolve().parents[2]
TESTBED_JOB = REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml"
TOPOLOGY = """SwitchName=leaf1 Nodes=n[1-2]
SwitchName=leaf2 Nodes=n[3-6]
SwitchName=leaf3 Nodes=n[7-8]
SwitchName=spine1 Switches=leaf[1-3]
"""
FABRIC = treeconf.parse(TOPOLOGY, "topology.conf")


@pytest.fixture
def topo(tmp_path: Path) -> Path:
    path = tmp_path / "topology.conf"
    path.write_text(TOPOLOGY)
    return path


def job_in(tmp_path: Path, small_corpus: Path, *overrides: str):
    return load_job(TESTBED_JOB, [f"run.root={tmp_path / 'runs'}", f"data.path={small_corpus}", *overrides])


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("srun: error: n4: task 3: Killed\n", TaskFailure("n4", "3", "Killed")),
        ("srun: error: n3: tasks 0-1: Exited with exit code 1", TaskFailure("n3", "0-1", "Exited with exit code 1")),
        ("srun: error: n3: tasks 0,2: Segmentation fault", TaskFailure("n3", "0,2", "Segmentation fault")),
        ("srun: launch/slurm: _step_signal: Terminating StepId=12002.0", None),
        ("0: srun: error: n4: task 3: Killed", None),
    ],
)
def test_srun_task_failures_are_parsed(line: str, expected: TaskFailure | None) -> None:
    assert parse_task_failure(line) == expected


def test_a_dead_node_is_blamed_before_the_survivor_that_failed_first() -> None:
    survivor = TaskFailure("n3", "0", "Exited with exit code 1")
    hosts = ("n3", "n4")
    assert failed_nodes(StepResult(1, None, survivor, ("n4",), False), hosts, ()) == ("n4",)
    assert failed_nodes(StepResult(1, None, survivor, (), False), hosts, ()) == ("n3",)
    # The watchdog's suspects (on the bad-node list) win over srun's first line; nodes off the step never count.
    assert failed_nodes(StepResult(143, 86, survivor, (), False), hosts, ("n4", "n9")) == ("n4",)
    assert failed_nodes(StepResult(143, 86, survivor, (), False), hosts, ()) == ()
    # Without spares only a dead node is blamed: a requeue on the same live nodes is as good as any.
    assert failed_nodes(StepResult(1, None, survivor, ("n4",), False), hosts, (), with_spares=False) == ("n4",)
    assert failed_nodes(StepResult(1, None, survivor, (), False), hosts, ("n4",), with_spares=False) == ()


def test_the_spare_nearest_the_failed_node_takes_its_ranks() -> None:
    ranks = ("n3", "n3", "n4", "n4")
    new, left, moved = replace_nodes(ranks, ["n4"], ["n1", "n7", "n5"], FABRIC)
    assert new == ("n3", "n3", "n5", "n5") and left == ("n1", "n7") and moved == {"n4": "n5"}
    # NVLink blocks of two nodes along leaf2: (n3, n4) and (n5, n6).
    assert pick_spare(FABRIC, "n5", ["n3", "n6"], domain_nodes=2) == "n6"
    assert pick_spare(None, "n5", ["n3", "n6"]) == "n3"


def test_spares_are_chosen_on_the_jobs_leaves_first() -> None:
    assert select_spares(FABRIC, ["n3", "n4"], set(FABRIC.nodes), 1) == ("n5",)
    assert select_spares(FABRIC, ["n1", "n2"], set(FABRIC.nodes) - {"n4"}, 2) == ("n3", "n5")


def test_without_a_placement_ranks_go_on_the_first_healthy_nodes() -> None:
    assert block_order(["n1", "n2", "n3"], ["n1"], 2, 2) == ("n2", "n2", "n3", "n3")


def test_spares_are_allocated_beside_the_placed_nodes_and_run_under_the_supervisor(
    tmp_path: Path, small_corpus: Path, topo: Path
) -> None:
    job = job_in(tmp_path, small_corpus, f"cluster.topology_file={topo}", "resources.spare_nodes=1")
    planned = plan(job)
    assert planned.request.nodelist == "n[3-5]" and planned.request.spares == ("n5",)
    assert set(planned.request.rank_hosts) == {"n3", "n4"}
    script = planned.script
    assert "#SBATCH --nodes=3\n" in script and "#SBATCH --no-kill\n" in script
    assert "-m air_hpc.runtime.supervisor" in script and "srun --ntasks=4 --distribution=arbitrary" in script


@pytest.mark.parametrize("with_topology", [True, False])
def test_more_spares_than_the_cluster_has_is_one_line_exit_2(
    tmp_path: Path, small_corpus: Path, topo: Path, with_topology: bool
) -> None:
    fake = FakeSlurm(nodes={f"n{i}": "IDLE" for i in range(1, 9)})
    args = ["submit", str(TESTBED_JOB), "--set", f"run.root={tmp_path}", "--set", f"data.path={small_corpus}"]
    args += ["--set", "resources.spare_nodes=7"]
    if with_topology:
        args += ["--set", f"cluster.topology_file={topo}"]
    with pytest.raises(ConfigError) as info:
        cli.main(args=args, prog_name="air-hpc", standalone_mode=False, obj={"slurm_client": fake})
    message = str(info.value)
    assert info.value.exit_code == ExitCode.USAGE and "\n" not in message
    assert message.startswith("resources.spare_nodes: 2 node(s) + 7 spare(s) exceed the 8 node(s)"), message
    assert not [c for c in fake.calls if c[:2] == ["sbatch", "--parsable"]]


FAKE_SRUN = """
import os, signal, sys, time
attempt = int(os.environ["AIR_HPC_STEP_ATTEMPT"])
hosts = open(os.environ["SLURM_HOSTFILE"]).read().split()
with open(os.environ["LOG"], "a") as log:
    log.write(f"{attempt} {' '.join(hosts)} {os.environ['MASTER_ADDR']} {' '.join(sys.argv[1:3])}\\n")
plan = os.environ["PLAN"].split(",")
if attempt >= len(plan) or plan[attempt] == "ok":
    sys.exit(0)
if plan[attempt] == "sleep":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    armed = os.path.join(os.environ["RUN"], "heartbeat", f"7-0.{attempt}")
    os.makedirs(armed, exist_ok=True)
    for rank in range(len(hosts)):
        open(os.path.join(armed, f"armed-{rank}"), "w").close()
    time.sleep(300)
print(f"srun: error: {hosts[-1]}: task {len(hosts) - 1}: Killed", file=sys.stderr, flush=True)
if plan[attempt] == "teardown":  # srun's own teardown: every node's stepd reports its tasks
    for task, host in enumerate(hosts[:-1]):
        print(f"srun: error: {host}: task {task}: Terminated", file=sys.stderr, flush=True)
if plan[attempt] == "stuck":  # srun waiting on a dead node: it never returns by itself
    time.sleep(300)
sys.exit(137)
"""


def supervised(tmp_path: Path, small_corpus: Path, plan_: str, spares: int = 2) -> tuple[Supervisor, RunDir, Path]:
    job = job_in(tmp_path, small_corpus, f"resources.spare_nodes={spares}", "health.preflight=false")
    run_dir = RunDir.of(job)
    run_dir.path.mkdir(parents=True)
    run_dir.write_job(job)
    srun = tmp_path / "srun.py"
    srun.write_text(FAKE_SRUN)
    hostfile = run_dir.path / "hostfile"
    hostfile.write_text("n3\nn3\nn4\nn4\n")
    log = tmp_path / "srun.log"
    environ = {
        **os.environ,
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": f"n[3-{4 + spares}]",
        "SLURM_HOSTFILE": str(hostfile),
        "LOG": str(log),
        "RUN": str(run_dir.path),
        "PLAN": plan_,
    }
    sup = Supervisor(job, run_dir, [sys.executable, str(srun), "--x"], environ, SlurmClient(), probe=lambda h: ())
    return sup, run_dir, log


def test_a_crashed_rank_restarts_on_a_spare_until_none_is_left(tmp_path: Path, small_corpus: Path) -> None:
    sup, run_dir, log = supervised(tmp_path, small_corpus, "crash,crash,crash")
    assert sup.run() == ExitCode.UNHEALTHY  # requeue-worthy: the batch script requeues without the bad nodes
    assert log.read_text().splitlines() == [
        "0 n3 n3 n4 n4 n3 --x",
        "1 n3 n3 n5 n5 n3 --x",
        "2 n3 n3 n6 n6 n3 --x",
    ]
    assert read_bad_nodes(run_dir.bad_nodes) == ("n4", "n5", "n6")
    events = read_events(run_dir.events)
    assert [e["kind"] for e in events] == [
        *("step_started", "step_ended", "in_job_restart") * 2,
        *("step_started", "step_ended", "spares_exhausted"),
    ]
    assert [e["replaced"] for e in events if e["kind"] == "in_job_restart"] == [{"n4": "n5"}, {"n5": "n6"}]
    assert [e["generation"] for e in events if e["kind"] == "step_started"] == ["7-0.0", "7-0.1", "7-0.2"]
    assert events[1]["failure"] == {"node": "n4", "tasks": "3", "reason": "Killed"}


def test_a_restart_that_finishes_returns_ok(tmp_path: Path, small_corpus: Path) -> None:
    sup, run_dir, log = supervised(tmp_path, small_corpus, "crash,ok")
    assert sup.run() == ExitCode.OK
    assert len(log.read_text().splitlines()) == 2
    assert (run_dir.path / "hostfile").read_text() == "n3\nn3\nn5\nn5\n"


def test_a_dead_node_found_by_the_probe_is_replaced(tmp_path: Path, small_corpus: Path) -> None:
    sup, run_dir, log = supervised(tmp_path, small_corpus, "crash,ok")
    sup.probe = lambda hosts: ("n3",)
    assert sup.run() == ExitCode.OK
    assert log.read_text().splitlines()[1].startswith("1 n5 n5 n4 n4 n5")  # rank 0's host moved: MASTER_ADDR too
    assert "node death" in run_dir.bad_nodes.read_text()


def test_without_spares_a_dead_node_ends_srun_at_once_and_is_kept_out(tmp_path: Path, small_corpus: Path) -> None:
    """srun waits for slurmctld to time a dead node out; the probe's verdict ends it and asks for a requeue."""
    sup, run_dir, log = supervised(tmp_path, small_corpus, "stuck,ok", spares=0)
    probed: list[tuple[str, ...]] = []

    def probe(hosts: Sequence[str]) -> tuple[str, ...]:
        probed.append(tuple(hosts))
        return ("n4",)

    sup.probe = probe
    started = time.monotonic()
    assert sup.run() == ExitCode.UNHEALTHY  # requeue-worthy: the batch script requeues without n4
    assert time.monotonic() - started < 30 and probed == [("n3", "n4")]
    assert len(log.read_text().splitlines()) == 1  # no in-job restart without a spare
    assert read_bad_nodes(run_dir.bad_nodes) == ("n4",) and "node death" in run_dir.bad_nodes.read_text()
    events = read_events(run_dir.events)
    assert [e["kind"] for e in events] == ["step_started", "step_ended", "node_dead"]
    assert events[1]["dead_nodes"] == ["n4"] and events[2]["nodes"] == ["n4"]


def test_without_spares_a_crashed_rank_on_a_live_node_is_handed_back_unchanged(
    tmp_path: Path, small_corpus: Path
) -> None:
    """The batch script requeues it as crashed, on the same nodes: a live node is not put on the bad-node list."""
    sup, run_dir, log = supervised(tmp_path, small_corpus, "crash,ok", spares=0)
    assert sup.run() == 137
    assert len(log.read_text().splitlines()) == 1
    assert not run_dir.bad_nodes.exists() or read_bad_nodes(run_dir.bad_nodes) == ()
    assert [e["kind"] for e in read_events(run_dir.events)] == ["step_started", "step_ended"]


def test_with_memory_snapshots_a_crashed_rank_restarts_on_the_same_nodes(tmp_path: Path, small_corpus: Path) -> None:
    """The holders keep the snapshots across the failed step: no requeue, no node blamed, bounded by max_restarts."""
    job = job_in(tmp_path, small_corpus, "resources.spare_nodes=0", "checkpoint.memory_interval_steps=1")
    sup, run_dir, log = supervised(tmp_path, small_corpus, "crash,crash,ok", spares=0)
    sup.job = job
    started: list[tuple[str, ...]] = []
    sup._start_holders = lambda nodes: started.append(tuple(nodes))  # type: ignore[method-assign]
    assert sup.run() == ExitCode.OK
    assert started == [("n3", "n4")]
    assert [line.split()[:5] for line in log.read_text().splitlines()] == [
        [str(a), "n3", "n3", "n4", "n4"] for a in range(3)
    ]
    assert not run_dir.bad_nodes.exists() or read_bad_nodes(run_dir.bad_nodes) == ()
    restarts = [e for e in read_events(run_dir.events) if e["kind"] == "in_job_restart"]
    assert [(e["attempt"], e["replaced"]) for e in restarts] == [(1, {}), (2, {})]
    assert "rank crash: task 3 on n4" in restarts[0]["reason"]

    sup, run_dir, log = supervised(tmp_path / "again", small_corpus, "crash,crash,crash,crash,ok", spares=0)
    sup.job = job
    sup._start_holders = lambda nodes: None  # type: ignore[method-assign]
    assert sup.run() == 137  # resilience.max_restarts (3) in-place restarts, then the batch script's requeue
    assert len(log.read_text().splitlines()) == 4


def test_with_memory_snapshots_a_crash_after_the_last_spare_restarts_in_place(
    tmp_path: Path, small_corpus: Path
) -> None:
    """The first crash takes the spare; the next, with none left, restarts on the same nodes from the snapshots
    instead of requeueing (which would end the holders and fall back to the persistent checkpoint)."""
    job = job_in(tmp_path, small_corpus, "resources.spare_nodes=1", "checkpoint.memory_interval_steps=1")
    sup, run_dir, log = supervised(tmp_path, small_corpus, "crash,crash,ok", spares=1)
    sup.job = job
    sup._start_holders = lambda nodes: None  # type: ignore[method-assign]
    assert sup.run() == ExitCode.OK
    assert [line.split()[:5] for line in log.read_text().splitlines()] == [
        ["0", "n3", "n3", "n4", "n4"],
        ["1", "n3", "n3", "n5", "n5"],
        ["2", "n3", "n3", "n5", "n5"],
    ]
    assert read_bad_nodes(run_dir.bad_nodes) == ("n4",)  # the node restarted on is not blamed
    events = read_events(run_dir.events)
    assert "spares_exhausted" not in [e["kind"] for e in events]
    restarts = [e for e in events if e["kind"] == "in_job_restart"]
    assert [(e["attempt"], e["replaced"], e["spares_left"]) for e in restarts] == [
        (1, {"n4": "n5"}, []),
        (2, {}, []),
    ]
    assert sup._next[2]  # a standby is still wanted for the next in-place restart

    # resilience.max_restarts (3) bounds the in-place restarts, not the move to the spare before them.
    sup, run_dir, log = supervised(tmp_path / "loop", small_corpus, "crash,crash,crash,crash,ok", spares=1)
    sup.job = job
    sup._start_holders = lambda nodes: None  # type: ignore[method-assign]
    assert sup.run() == ExitCode.OK
    restarts = [e["replaced"] for e in read_events(run_dir.events) if e["kind"] == "in_job_restart"]
    assert restarts == [{"n4": "n5"}, {}, {}, {}] and len(log.read_text().splitlines()) == 5
    sup, run_dir, log = supervised(tmp_path / "looping", small_corpus, "crash,crash,crash,crash,crash,ok", spares=1)
    sup.job = job
    sup._start_holders = lambda nodes: None  # type: ignore[method-assign]
    assert sup.run() == ExitCode.UNHEALTHY and len(log.read_text().splitlines()) == 5  # then the node is blamed

    # A hang is not restarted in place (its node may be at fault): with no spare left it requeues.
    sup, run_dir, log = supervised(tmp_path / "hung", small_corpus, "crash,crash,ok", spares=1)
    sup.job = job
    sup._start_holders = lambda nodes: None  # type: ignore[method-assign]
    results = iter([False, True])
    real_run_step = sup._run_step

    def run_step(attempt: int, rank_hosts: Sequence[str], spares: Sequence[str]) -> StepResult:
        result = real_run_step(attempt, rank_hosts, spares)
        return dataclasses.replace(result, hung=next(results))

    sup._run_step = run_step  # type: ignore[method-assign]
    assert sup.run() == ExitCode.UNHEALTHY
    assert read_bad_nodes(run_dir.bad_nodes) == ("n4", "n5")
    assert [e["kind"] for e in read_events(run_dir.events)][-1] == "spares_exhausted"


def test_when_every_node_reported_its_tasks_the_probe_is_not_waited_for(tmp_path: Path, small_corpus: Path) -> None:
    """A node whose stepd reported a task's end is alive: after srun's own teardown there is nothing to probe."""
    sup, run_dir, _ = supervised(tmp_path, small_corpus, "teardown", spares=0)

    released, probed = threading.Event(), threading.Event()

    def slow_probe(hosts: Sequence[str]) -> tuple[str, ...]:
        released.wait(60)
        probed.set()
        return ("n3",)

    sup.probe = slow_probe
    try:
        assert sup.run() == 137
        assert not probed.is_set()  # run() ended without the probe's answer (waiting would take 60 s and fail)
    finally:
        released.set()
    assert [e["dead_nodes"] for e in read_events(run_dir.events) if e["kind"] == "step_ended"] == [[]]


def start_supervisor(tmp_path: Path, small_corpus: Path) -> tuple[subprocess.Popen[bytes], psutil.Process]:
    sup, run_dir, log = supervised(tmp_path, small_corpus, "sleep")
    env = {**sup.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "air_hpc.runtime.supervisor", str(run_dir.path), "--", *sup.srun_argv], env=env
    )
    deadline = time.monotonic() + 60
    armed = run_dir.heartbeat / "7-0.0"
    while not log.exists() or not psutil.Process(proc.pid).children() or len(list(armed.glob("armed-*"))) < 4:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    return proc, psutil.Process(proc.pid).children()[0]


def test_a_stop_signal_is_forwarded_and_nothing_is_left_behind(tmp_path: Path, small_corpus: Path) -> None:
    proc, srun = start_supervisor(tmp_path, small_corpus)
    proc.send_signal(signal.SIGUSR2)
    assert proc.wait(timeout=30) == 128 + signal.SIGUSR2  # the step's own exit code; no restart after a stop
    assert not srun.is_running()
    events = read_events(RunDir(tmp_path / "runs" / "gpt-tiny-testbed").events)
    assert [e["kind"] for e in events] == ["step_started", "step_ended"]


def test_a_killed_supervisor_takes_its_step_along(tmp_path: Path, small_corpus: Path) -> None:
    proc, srun = start_supervisor(tmp_path, small_corpus)
    proc.kill()
    proc.wait(timeout=10)
    psutil.wait_procs([srun], timeout=10)
    assert not srun.is_running()


def test_bad_usage_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from air_hpc.runtime.supervisor import main

    assert main(["/nowhere"]) == ExitCode.USAGE
    assert capsys.readouterr().err.count("\n") == 1


def test_events_are_json_lines(tmp_path: Path, small_corpus: Path) -> None:
    sup, run_dir, _ = supervised(tmp_path, small_corpus, "ok")
    assert sup.run() == ExitCode.OK
    assert all(json.loads(line)["job_id"] == "7" for line in run_dir.events.read_text().splitlines())


def test_a_supervisor_of_a_job_that_does_not_own_the_run_starts_nothing(
    tmp_path: Path, small_corpus: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from air_hpc.ownership.owner import claim
    from air_hpc.runtime.supervisor import main

    sup, run_dir, log = supervised(tmp_path, small_corpus, "ok")
    with claim(run_dir, lambda owner: False) as record:
        record("99", "slurm")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    assert main([str(run_dir.path), "--", *sup.srun_argv]) != ExitCode.OK
    assert "belongs to job 99" in capsys.readouterr().err
    assert not log.exists() and not run_dir.events.exists()


def test_a_stop_recorded_before_the_supervisor_was_armed_requeues_without_a_step(
    tmp_path: Path, small_corpus: Path
) -> None:
    sup, run_dir, log = supervised(tmp_path, small_corpus, "ok")
    job_start = run_dir.heartbeat / "7-0"
    job_start.mkdir(parents=True)
    (job_start / "stop_requested").touch()  # what the batch shell's trap writes
    handled = (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    previous = {signum: signal.getsignal(signum) for signum in handled}
    sup.install_signals()
    try:
        assert (job_start / "armed-supervisor").exists()  # the batch shell forwards from now on
        assert sup.run() == ExitCode.REQUEUE
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    assert not log.exists()


def test_standbys_start_with_the_step_and_only_while_a_restart_is_left(tmp_path: Path, small_corpus: Path) -> None:
    """With the step (their imports take only the CPU it leaves idle): a fault soon after a start or a restart then
    finds them further on. None once no restart is left, none twice."""
    sup, _, _ = supervised(tmp_path, small_corpus, "ok", spares=1)
    srun = tmp_path / "bin" / "srun"  # standbys serve a real srun step: a stand-in under that name
    srun.parent.mkdir()
    srun.write_text("#!/bin/sh\nexec sleep 60\n")
    srun.chmod(0o755)
    sup.srun_argv = (str(srun), "--x")
    try:
        sup._next = (1, ("n3", "n4", "n5"), False)
        sup._start_standby()
        assert sup._standby is None  # no spare and no in-place restart left: nothing to stand by for
        sup._next = (1, ("n3", "n4", "n5"), True)
        sup._start_standby()
        standby = sup._standby
        assert standby is not None and standby.attempt == 1
        assert all(standby.group.alive(node) for node in ("n3", "n4", "n5"))
        sup._start_standby()
        assert sup._standby is standby
    finally:
        sup._end_step()
