"""The rendered batch script's behaviour, run by bash with stub ``srun``/``scontrol`` on PATH.

The exit-code contract end to end: requeue-worthy codes requeue within the
budget, failures keep their code (never 0), and the signal Slurm sends the
batch shell reaches the step. The same script runs on the real testbed in
tests/integration/test_jobs_testbed.py.
"""

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from air_hpc.config import load_job
from air_hpc.exitcodes import REQUEUE_WORTHY, ExitCode
from air_hpc.records.rundir import RunDir
from air_hpc.render import NodeRequest, build_spec, render_script
from air_hpc.runtime.rendezvous import master_port

REPO = Path(__file__).resolve().parents[2]
TESTBED_JOB = REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml"

SRUN = """#!/bin/bash
printf '%s\\n' "$*" >>"$STUB_LOG/srun"
while [[ "$1" == --* ]]; do shift; done
exec "$@"
"""
SCONTROL = """#!/bin/bash
case "$1" in
    --version) echo "slurm ${STUB_SLURM_VERSION:-22.05.8}" ;;
    --oneliner) echo "JobId=$4 JobState=RUNNING PreemptEligibleTime=2026-12-03T07:12:18 \\
PreemptTime=${STUB_PREEMPT_TIME:-None} EndTime=${STUB_END_TIME:-2026-12-03T08:12:18} Restarts=0" ;;
    show) echo n7; echo n8 ;;
    requeue) echo "$2" >>"$STUB_LOG/requeued" ;;
    *) exit 1 ;;
esac
"""


@pytest.fixture
def stubs(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def write_script(tmp_path: Path, step: list[str], request: NodeRequest | None = None, *extra: str) -> Path:
    job = load_job(TESTBED_JOB, [f"run.root={tmp_path}", "run.name=run", *extra])
    job.run.dir.mkdir(parents=True, exist_ok=True)
    RunDir(job.run.dir).write_job(job)  # the supervisor reads it
    path = tmp_path / "job.sbatch"
    path.write_text(render_script(build_spec(job, request, step_command=step)))
    return path


def environ(tmp_path: Path, stubs: Path, restarts: int | None) -> dict[str, str]:
    env = {
        **os.environ,
        "PATH": f"{stubs}:{os.environ['PATH']}",
        "STUB_LOG": str(tmp_path),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "n[7-8]",
    }
    env.pop("SLURM_RESTART_COUNT", None)
    if restarts is not None:
        env["SLURM_RESTART_COUNT"] = str(restarts)
    return env


def requeued(tmp_path: Path) -> list[str]:
    path = tmp_path / "requeued"
    return path.read_text().split() if path.exists() else []


def events_of(tmp_path: Path, kind: str | None = None) -> list[dict[str, Any]]:
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    return [e for e in events if kind is None or e["kind"] == kind]


@pytest.mark.parametrize(
    ("code", "restarts", "expect_requeue"),
    [
        (ExitCode.OK, None, False),
        (ExitCode.FAILURE, None, True),  # a crash resumes from the newest checkpoint
        (137, 3, False),  # ... within the restart budget
        (ExitCode.USAGE, 0, False),
        (ExitCode.UNREACHABLE, 0, False),
        (ExitCode.CRASH_LOOP, None, False),
        *[(c, None, True) for c in sorted(REQUEUE_WORTHY)],
        (ExitCode.REQUEUE, 2, True),
        (ExitCode.REQUEUE, 3, False),
    ],
)
def test_exit_code_contract(tmp_path: Path, stubs: Path, code: int, restarts: int | None, expect_requeue: bool) -> None:
    script = write_script(tmp_path, ["bash", "-c", f"exit {int(code)}"])
    result = subprocess.run(["bash", str(script)], env=environ(tmp_path, stubs, restarts), capture_output=True)
    assert result.returncode == int(code), result.stderr
    assert requeued(tmp_path) == (["4242"] if expect_requeue else [])


#: The first step of the job's first start: the supervisor's step attempt 0.
STEP_DIR = Path("run") / "heartbeat" / "4242-0.0"


def arm_all(tmp_path: Path) -> str:
    """The step announcing that its 4 ranks (gpt-tiny-testbed: 2 nodes x 2 tasks) handle the stop signal."""
    step = tmp_path / STEP_DIR
    return f"mkdir -p {step} && touch {step}/armed-{{0,1,2,3}}"


def test_signal_is_forwarded_to_the_step_which_requeues(tmp_path: Path, stubs: Path) -> None:
    ready = tmp_path / "ready"
    payload = (
        f"trap 'echo got-usr2; exit {int(ExitCode.REQUEUE)}' USR2; {arm_all(tmp_path)}; touch {ready}; "
        "while :; do sleep 0.1; done"
    )
    script = write_script(tmp_path, ["bash", "-c", payload])
    proc = subprocess.Popen(
        ["bash", str(script)], env=environ(tmp_path, stubs, None), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 60  # a deadline, not a timing: generous on a loaded machine
        while not ready.exists():
            assert time.monotonic() < deadline, "the step never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR2)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == ExitCode.REQUEUE
    assert b"got-usr2" in out
    assert b"forwarding to the training step" in err
    assert requeued(tmp_path) == ["4242"]
    events = [e for e in events_of(tmp_path) if e["kind"] not in ("step_started", "step_ended")]
    assert [(e["kind"], e["job_id"]) for e in events] == [("signal", "4242"), ("requeue", "4242")]
    assert events[0]["signal"] == "SIGUSR2" and events[1]["exit_code"] == ExitCode.REQUEUE
    assert events[0]["time"] <= events[1]["time"]


def test_a_signal_before_the_ranks_are_armed_is_recorded_for_them_not_sent(tmp_path: Path, stubs: Path) -> None:
    """A rank still starting would die of the signal: it reads the recorded stop once armed instead."""
    ready = tmp_path / "ready"
    stop = tmp_path / STEP_DIR / "stop_requested"
    payload = (
        f"touch {ready}; while [[ ! -e {stop} ]]; do sleep 0.05; done; {arm_all(tmp_path)}; "
        f"[[ -e {stop} ]] && exit {int(ExitCode.REQUEUE)}"
    )  # no trap: a forwarded USR2 would kill it
    script = write_script(tmp_path, ["bash", "-c", payload])
    proc = subprocess.Popen(
        ["bash", str(script)], env=environ(tmp_path, stubs, None), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 60  # a deadline, not a timing: generous on a loaded machine
        while not ready.exists():
            assert time.monotonic() < deadline, "the step never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR2)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == ExitCode.REQUEUE, err
    assert b"while the ranks start: they read the stop once armed" in err
    assert requeued(tmp_path) == ["4242"]


def test_the_signal_trap_is_the_first_command(tmp_path: Path) -> None:
    script = write_script(tmp_path, ["true"]).read_text().splitlines()
    commands = [line for line in script if line.strip() and not line.startswith("#")]
    assert commands[:4] == [f"trap 'stop_pending=SIG{name}' {name}" for name in ("USR2", "TERM", "INT", "HUP")]


def test_start_is_recorded_and_master_derived(tmp_path: Path, stubs: Path) -> None:
    script = write_script(tmp_path, ["bash", "-c", 'echo "$MASTER_ADDR:$MASTER_PORT:$OMP_NUM_THREADS"'])
    result = subprocess.run(
        ["bash", str(script)], env=environ(tmp_path, stubs, 1), capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == f"n7:{master_port(4242, 1)}:1"  # the second start's port
    (line,) = (tmp_path / "run" / "submissions.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert (record["kind"], record["job_id"], record["restart_count"], record["nodelist"]) == (
        "started",
        "4242",
        1,
        "n[7-8]",
    )


def test_rank_order_reaches_srun(tmp_path: Path, stubs: Path) -> None:
    request = NodeRequest(nodelist="n[7-8]", rank_hosts=("n8", "n8", "n7", "n7"))
    script = write_script(tmp_path, ["bash", "-c", 'cat "$SLURM_HOSTFILE"; echo "master=$MASTER_ADDR"'], request)
    result = subprocess.run(
        ["bash", str(script)], env=environ(tmp_path, stubs, None), capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["n8", "n8", "n7", "n7", "master=n8"]
    assert "--distribution=arbitrary" in (tmp_path / "srun").read_text()


@pytest.mark.parametrize(
    ("version", "restarts", "expect_requeue"),
    [("22.05.8", None, True), ("23.11.10", 3, True), ("24.11.5", None, False), ("25.05.0", 3, False)],
)
def test_slurm_preemption_is_requeued_once(
    tmp_path: Path, stubs: Path, version: str, restarts: int | None, expect_requeue: bool
) -> None:
    """Before 24.05 Slurm does not requeue a preempted job that ended within GraceTime: the script does, whatever
    the restart budget; from 24.05 Slurm does, and the script must not requeue it a second time."""
    script = write_script(tmp_path, ["bash", "-c", f"exit {int(ExitCode.REQUEUE)}"])
    now = time.time()
    env = {
        **environ(tmp_path, stubs, restarts),
        "STUB_SLURM_VERSION": version,
        "STUB_PREEMPT_TIME": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now - 4)),
        "STUB_END_TIME": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now + 26)),
    }
    result = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert result.returncode == ExitCode.REQUEUE, result.stderr
    assert requeued(tmp_path) == (["4242"] if expect_requeue else [])
    (event,) = events_of(tmp_path, "preempted")
    assert event["requeue_by"] == ("batch" if expect_requeue else "slurm")
    # The script's own run time (Python starts twice) adds to the 4 s since the preemption.
    assert event["grace_s"] == 30 and event["fit"] is True and 3 <= int(str(event["ended_after_s"])) <= 20


def test_a_save_past_the_grace_time_is_reported(tmp_path: Path, stubs: Path) -> None:
    script = write_script(tmp_path, ["bash", "-c", f"exit {int(ExitCode.REQUEUE)}"])
    now = time.time()
    env = {
        **environ(tmp_path, stubs, None),
        "STUB_PREEMPT_TIME": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now - 40)),
        "STUB_END_TIME": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now - 10)),
    }
    subprocess.run(["bash", str(script)], env=env, capture_output=True, check=False)
    (event,) = events_of(tmp_path, "preempted")
    assert event["fit"] is False and event["grace_s"] == 30


@pytest.mark.parametrize("stop_signal", ["USR2", "TERM"])
def test_a_stop_signal_to_the_whole_batch_step_as_the_supervisor_starts_requeues_it(
    tmp_path: Path, stubs: Path, stop_signal: str
) -> None:
    """Slurm delivers --signal=B:SIG to every process of the batch step: the supervisor, still starting, ignores
    it (it would die of it: a crash, no save) and finds the stop the shell recorded once it handles signals."""
    ran = tmp_path / "step-ran"
    proc, err = run_signalled(
        tmp_path,
        stubs,
        ["touch", str(ran)],
        supervisor_started,
        lambda pid: os.killpg(pid, signal.Signals[f"SIG{stop_signal}"]),
        f"resilience.signal={stop_signal}",
    )
    assert proc.returncode == ExitCode.REQUEUE, err
    assert b"a stop was requested before the supervisor was armed" in err
    assert not ran.exists()
    assert requeued(tmp_path) == ["4242"]
    assert [e["exit_code"] for e in events_of(tmp_path, "requeue")] == [ExitCode.REQUEUE]


def supervisor_started(pid: int) -> bool:
    with contextlib.suppress(psutil.Error):
        return any("air_hpc.runtime.supervisor" in c.cmdline() for c in psutil.Process(pid).children(recursive=True))
    return False


def helper_starting(pid: int) -> bool:
    """The batch shell is in ``helper start`` (its first command after the traps)."""
    with contextlib.suppress(psutil.Error):
        return any(
            "air_hpc.runtime.batch" in c.cmdline() and "start" in c.cmdline()
            for c in psutil.Process(pid).children(recursive=True)
        )
    return False


def run_signalled(
    tmp_path: Path, stubs: Path, step: list[str], when: Any, send: Any, *extra: str
) -> tuple[subprocess.Popen[bytes], bytes]:
    """Run the script (``extra``: job overrides), ``send(pid)`` once ``when(pid)`` holds; returns the process,
    ended, and its stderr."""
    script = write_script(tmp_path, step, None, *extra)
    proc = subprocess.Popen(
        ["bash", str(script)],
        env=environ(tmp_path, stubs, None),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not when(proc.pid):
            assert time.monotonic() < deadline and proc.poll() is None, "the moment never came"
            time.sleep(0.002)
        send(proc.pid)
        _, err = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return proc, err


def test_sigterm_to_the_batch_shell_as_it_starts_is_a_stop_that_requeues(tmp_path: Path, stubs: Path) -> None:
    """``kill -TERM`` of the batch shell in its first second (issue 27 item 6) was FAILED 1:0: it is a stop."""
    ran = tmp_path / "step-ran"
    proc, err = run_signalled(
        tmp_path, stubs, ["touch", str(ran)], helper_starting, lambda pid: os.kill(pid, signal.SIGTERM)
    )
    assert proc.returncode == ExitCode.REQUEUE, err
    assert b"got SIGTERM while the supervisor starts" in err
    assert not ran.exists()
    assert requeued(tmp_path) == ["4242"]
    assert [e["signal"] for e in events_of(tmp_path, "signal")] == ["SIGTERM"]


def test_sigterm_to_the_batch_shell_mid_step_saves_and_requeues(tmp_path: Path, stubs: Path) -> None:
    """``kill -TERM`` of the batch shell while the ranks train (issue 27 item 6) was FAILED 0:15: the ranks get the
    stop signal, save (exit 85) and the job requeues."""
    ready = tmp_path / "ready"
    payload = (
        f"trap 'echo got-usr2; exit {int(ExitCode.REQUEUE)}' USR2; {arm_all(tmp_path)}; touch {ready}; "
        "while :; do sleep 0.1; done"
    )
    proc, err = run_signalled(
        tmp_path, stubs, ["bash", "-c", payload], lambda _: ready.exists(), lambda pid: os.kill(pid, signal.SIGTERM)
    )
    assert proc.returncode == ExitCode.REQUEUE, err
    assert b"got SIGTERM, forwarding to the training step as SIGUSR2" in err
    assert requeued(tmp_path) == ["4242"]
    assert [e["signal"] for e in events_of(tmp_path, "signal")] == ["SIGTERM"]


def test_a_user_signal_to_the_batch_step_as_it_starts_requeues_it(tmp_path: Path, stubs: Path) -> None:
    """``scancel --signal=USR2 --batch`` the moment the job runs (issue 27 item 7): Slurm signals every process of
    the batch step while the helper records the start; the stop is recorded and acted on, not lost."""
    ran = tmp_path / "step-ran"
    proc, err = run_signalled(
        tmp_path, stubs, ["touch", str(ran)], helper_starting, lambda pid: os.killpg(pid, signal.SIGUSR2)
    )
    assert proc.returncode == ExitCode.REQUEUE, err
    assert not ran.exists()
    assert requeued(tmp_path) == ["4242"]
