"""``air-hpc chaos`` as a user drives it (issue 24 item 2, issue 27 item 11): the testbed it runs on, what it does
when interrupted, its progress lines, and its warning about a timeout shorter than the job's hang limit."""

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import click
import psutil
import pytest

from air_hpc.chaos.campaign import Campaign, _clean_up, run_campaign, timeout_warning
from air_hpc.chaos.inject import RankProcess, hang
from air_hpc.cli.chaos_cmd import sigterm_interrupts
from air_hpc.cli.main import cli
from air_hpc.cli.options import testbed_state_dir as resolve_state_dir
from air_hpc.config import load_job
from air_hpc.errors import TestbedError
from air_hpc.slurm.fake import FakeSlurm
from air_hpc.slurm.jobs import JobState
from air_hpc.testbed import default_state_dir
from air_hpc.testbed.conf import TESTBED_CONF_HEADER, Layout
from air_hpc.train import data
from tests.conftest import RunMain
from tests.unit.test_chaos import _target
from tests.unit.test_cli import TESTBED_JOB

# ---- which testbed -----------------------------------------------------------------


def make_testbed(root: Path) -> Layout:
    """A testbed's state directory as ``testbed up`` leaves it, as far as finding it goes: its slurm.conf."""
    layout = Layout(root)
    layout.etc.mkdir(parents=True)
    layout.slurm_conf.write_text(f"# {TESTBED_CONF_HEADER}\nClusterName=testbed\n")
    return layout


def test_state_dir_explicit_then_the_testbed_of_slurm_conf_then_the_default(tmp_path: Path) -> None:
    mine = make_testbed(tmp_path / "mine")
    env = {"SLURM_CONF": str(mine.slurm_conf)}
    assert resolve_state_dir(tmp_path / "given", env) == tmp_path / "given"
    assert resolve_state_dir(None, env) == mine.root
    other = tmp_path / "etc" / "slurm.conf"  # a real cluster's configuration: not a testbed's
    other.parent.mkdir()
    other.write_text("ClusterName=prod\n")
    assert resolve_state_dir(None, {"SLURM_CONF": str(other)}) == default_state_dir()
    assert resolve_state_dir(None, {"SLURM_CONF": str(tmp_path / "gone" / "etc" / "slurm.conf")}) == default_state_dir()
    assert resolve_state_dir(None, {}) == default_state_dir()


def _commands(group: click.Group, ctx: click.Context, prefix: str = "") -> Iterator[tuple[str, click.Command]]:
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        yield f"{prefix}{name}", command
        if isinstance(command, click.Group):
            yield from _commands(command, click.Context(command, parent=ctx), f"{prefix}{name} ")


def test_every_command_with_a_state_dir_follows_the_one_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`eval "$(air-hpc testbed env --state-dir X)"` then chaos ran on the default testbed, beside others' jobs."""
    mine = make_testbed(tmp_path / "mine")
    monkeypatch.setenv("SLURM_CONF", str(mine.slurm_conf))
    seen = []
    for name, command in _commands(cli, click.Context(cli)):
        for param in command.params:
            if param.name == "state_dir":
                ctx = click.Context(command)
                assert param.process_value(ctx, None) == mine.root, f"air-hpc {name} --state-dir"
                assert param.process_value(ctx, str(tmp_path / "x")) == tmp_path / "x", f"air-hpc {name} --state-dir"
                seen.append(name)
    assert {"chaos", "demo", "testbed up", "testbed down", "testbed status", "testbed env"} <= set(seen)


def test_testbed_env_names_the_testbed_slurm_conf_points_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_main: RunMain
) -> None:
    mine = make_testbed(tmp_path / "mine")
    monkeypatch.setenv("SLURM_CONF", str(mine.slurm_conf))
    code, out, _ = run_main(["testbed", "env"])
    assert (code, out) == (0, f"export SLURM_CONF={mine.slurm_conf.resolve()}\n")


# ---- the timeout against the hang limit ----------------------------------------------


def test_a_timeout_shorter_than_the_hang_limit_is_named_with_its_key() -> None:
    job = load_job(
        TESTBED_JOB, ["health.heartbeat_step_s=60", "health.heartbeat_checkpoint_s=90", "checkpoint.async_wait_s=30"]
    )
    warning = timeout_warning(job, ("preempt", "hang"), 90)
    assert warning.startswith("--timeout-s 90 is not longer than the job's hang limit (health.heartbeat_checkpoint_s")
    assert timeout_warning(job, ("preempt", "hang"), 91) == ""
    assert timeout_warning(job, ("preempt", "rank-kill"), 10) == "", "no hang scheduled: no hang to wait for"
    no_watchdog = load_job(TESTBED_JOB, ["health.watchdog=false"])
    assert "the supervisor's hang backstop (health.watchdog is off)" in timeout_warning(no_watchdog, ("hang",), 900)


def test_chaos_warns_before_it_starts_the_testbed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_main: RunMain
) -> None:
    started: list[object] = []

    def up(self: object, *args: object, **kwargs: object) -> None:
        started.append(self)
        raise TestbedError("testbed not started in this test")

    monkeypatch.setattr("air_hpc.testbed.Testbed.up", up)
    args = ["chaos", TESTBED_JOB, "--faults", "hang", "--count", "1", "--timeout-s", "30"]
    code, _, err = run_main([*args, "--state-dir", str(tmp_path / "tb")])
    warning, testbed, error = err.splitlines()
    assert warning.startswith("warning: --timeout-s 30 is not longer than the job's hang limit") and started
    assert testbed == f"chaos: testbed {(tmp_path / 'tb').resolve()}"
    assert code != 0 and "testbed not started in this test" in error


# ---- interrupted --------------------------------------------------------------------


def _campaign(tmp_path: Path, kinds: tuple[str, ...], timeout_s: float) -> Campaign:
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 50)
    corpus = data.prepare([text], tmp_path / "corpus.h5", data.ByteTokenizer()).path
    topology = tmp_path / "topology.conf"
    topology.write_text("SwitchName=a Nodes=n[1-2]\nSwitchName=b Nodes=n[3-4]\nSwitchName=top Switches=a,b\n")
    overrides = (f"run.root={tmp_path / 'runs'}", f"data.path={corpus}")
    return Campaign(Path(TESTBED_JOB), overrides, kinds, 1, 1, topology, timeout_s=timeout_s, poll_s=0.05)


def test_sigterm_ends_a_campaign_through_its_clean_up(tmp_path: Path) -> None:
    """A job was left RUNNING when chaos was stopped: SIGTERM (a timeout, a scheduler) now cancels both copies."""
    fake = FakeSlurm(nodes={f"n{i}": "IDLE" for i in range(1, 5)})
    lines: list[str] = []

    def stop_once_both_are_submitted() -> None:  # not after a fixed delay: a loaded machine submits later
        deadline = time.monotonic() + 120
        while len(fake.jobs) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    stopper = threading.Thread(target=stop_once_both_are_submitted)
    with sigterm_interrupts(), pytest.raises(KeyboardInterrupt):
        stopper.start()
        run_campaign(_campaign(tmp_path, ("preempt",), timeout_s=300), fake, say=lines.append)
    stopper.join()
    assert signal.getsignal(signal.SIGTERM) is not None and len(fake.jobs) == 2
    assert all(job.state == JobState.CANCELLED for job in fake.jobs.values())
    assert lines[0].startswith("submitted job ") and lines[-1] == f"cancelled job(s) {', '.join(sorted(fake.jobs))}"


def settled(proc: psutil.Process, status: str) -> bool:
    """Whether ``proc`` reaches ``status`` (a signal is delivered a moment after it is sent)."""
    deadline = time.monotonic() + 10
    while proc.status() != status and time.monotonic() < deadline:
        time.sleep(0.01)
    return proc.status() == status


@pytest.fixture
def sleeper() -> Iterator[psutil.Process]:
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield psutil.Process(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_a_rank_the_campaign_stopped_is_continued_however_it_ends(
    tmp_path: Path, sleeper: psutil.Process, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hang fault's SIGSTOP outlived an interrupted campaign: the clean-up continues the rank, then cancels."""
    fake, target = _target(tmp_path, steps=3)
    rank = RankProcess(0, sleeper.pid, sleeper.create_time(), "n1")
    monkeypatch.setattr("air_hpc.chaos.inject.rank_processes", lambda job_id, run_dir=None: [rank])
    assert hang(target) == f"SIGSTOP rank 0 pid {sleeper.pid} on n1"
    assert settled(sleeper, psutil.STATUS_STOPPED)
    lines: list[str] = []
    _clean_up(fake, target, ["7"], lines.append)
    assert settled(sleeper, psutil.STATUS_SLEEPING) and target.stopped == []
    assert fake.jobs["7"].state == JobState.CANCELLED
    assert lines == ["continued 1 stopped rank process(es) (SIGCONT)", "cancelled job(s) 7"]


def test_a_copy_that_already_ended_is_said_not_cancelled(tmp_path: Path) -> None:
    fake, target = _target(tmp_path, steps=3, state=JobState.COMPLETED)
    lines: list[str] = []
    _clean_up(fake, target, ["7"], lines.append)
    assert fake.jobs["7"].state == JobState.COMPLETED and lines == ["job 7 had already ended (COMPLETED)"]
