"""Stop flags set by real signals, the deadline arithmetic, and the events log."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

from air_hpc.config.models import SignalName
from air_hpc.errors import ConfigError
from air_hpc.records.events import CheckpointSaved, EventLog, FreshStart, Signal, read_events
from air_hpc.resilience.signals import STOP_SIGNALS, Deadline, StopRequest, agree, agree_stop, signal_number
from air_hpc.train.trainer import ALWAYS_STOP_ON


@pytest.mark.parametrize(("name", "expected"), [("USR2", signal.SIGUSR2), ("sigterm", signal.SIGTERM), ("10", 10)])
def test_signal_names(name: str, expected: int) -> None:
    assert signal_number(name) == expected


@pytest.mark.parametrize("name", ["USR3", "", "999", "SIGNOPE", "١٢"])  # Arabic-Indic 12: int() reads it
def test_bad_signal_names(name: str) -> None:
    with pytest.raises(ConfigError, match=r"resilience\.signal"):
        signal_number(name)


def test_handler_only_sets_the_flag_and_restores_previous() -> None:
    previous = signal.getsignal(signal.SIGUSR2)
    stop = StopRequest.install(["USR2", "TERM", "SIGUSR2"])
    try:
        assert not stop.requested and stop.signal_name is None
        os.kill(os.getpid(), signal.SIGUSR2)
        os.kill(os.getpid(), signal.SIGTERM)  # would end the process with the default handler
        assert stop.requested
        assert stop.signal_name == "SIGUSR2"  # the first one wins
        assert stop.received_at_s is not None
    finally:
        stop.uninstall()
    assert signal.getsignal(signal.SIGUSR2) == previous


def test_agree_without_process_group_returns_the_flag() -> None:
    assert agree(True) is True and agree(False) is False


def test_deadline_sources_in_order() -> None:
    env = {"SLURM_JOB_START_TIME": "1000", "AIR_HPC_JOB_START_S": "2000"}
    d = Deadline.from_env(time_limit_min=10, margin_s=60, env=env)
    assert (d.stop_at_s, d.source) == (1000 + 600 - 60, "SLURM_JOB_START_TIME")
    d = Deadline.from_env(time_limit_min=10, margin_s=60, env={"AIR_HPC_JOB_START_S": "2000"})
    assert d.stop_at_s == 2540
    d = Deadline.from_env(time_limit_min=10, margin_s=60, env={**env, "SLURM_JOB_END_TIME": "5000"})
    assert (d.stop_at_s, d.source) == (4940, "SLURM_JOB_END_TIME")
    d = Deadline.from_env(time_limit_min=10, margin_s=60, env=env, explicit_stop_at_s=42.0)
    assert (d.stop_at_s, d.source) == (42.0, "explicit")


def test_deadline_without_start_time_counts_from_now_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    d = Deadline.from_env(time_limit_min=1, margin_s=10, env={"SLURM_JOB_START_TIME": "soon"}, now_s=100.0)
    assert (d.stop_at_s, d.source) == (150.0, "process start")
    assert "not epoch seconds" in caplog.text and "start time unknown" in caplog.text


def test_deadline_from_the_batch_scripts_started_line(tmp_path: Path) -> None:
    submissions = tmp_path / "submissions.jsonl"
    submissions.write_text(
        '{"event": "started", "job_id": "7", "restart_count": 0, "time": 1000}\n'
        '{"event": "started", "job_id": "8", "restart_count": 0, "time": 3000}\n'
        '{"event": "started", "job_id": "7", "restart_count": 1, "time": 2000}\n'
    )
    d = Deadline.from_env(10, 60, env={"SLURM_JOB_ID": "7"}, submissions=submissions)
    assert (d.stop_at_s, d.source) == (2000 + 600 - 60, "submissions.jsonl")
    d = Deadline.from_env(10, 60, env={"SLURM_JOB_ID": "9"}, submissions=submissions, now_s=5.0)
    assert d.source == "process start"


def test_agree_stop_without_process_group() -> None:
    stop = StopRequest()
    assert agree_stop(stop, Deadline.none()) is None
    assert agree_stop(stop, Deadline(100.0, "explicit"), now_s=100.0) == "deadline"
    stop._handle(12, None)
    assert agree_stop(stop, Deadline(100.0, "explicit"), now_s=100.0) == "signal"


def test_deadline_reached() -> None:
    d = Deadline(stop_at_s=100.0, source="explicit")
    assert not d.reached(now_s=99.0) and d.reached(now_s=100.0)
    assert d.remaining_s(now_s=40.0) == 60.0
    assert not Deadline.none().reached() and Deadline.none().remaining_s() is None


def test_events_are_appended_as_json_lines(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "run" / "events.jsonl", {"job_id": "7"})
    log.emit(Signal(signal="SIGUSR2"))
    log.emit(CheckpointSaved(7, 123, 0.5, 0.5, str(tmp_path), "signal", {"write": 0.4}, async_=False))
    lines = (tmp_path / "run" / "events.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    assert first == {"time": first["time"], "kind": "signal", "job_id": "7", "signal": "SIGUSR2"}
    assert isinstance(first["time"], float)
    saved = json.loads(lines[1])
    assert list(saved)[-3:] == ["reason", "phases", "async"] and saved["async"] is False
    assert [e["kind"] for e in read_events(log.path)] == ["signal", "checkpoint_saved"]


def test_torn_last_line_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = EventLog(tmp_path / "events.jsonl")
    log.emit(FreshStart(skipped=0))
    with open(log.path, "a") as stream:
        stream.write('{"time": 1, "kind": "sto')
    assert [e["kind"] for e in read_events(log.path)] == ["fresh_start"]
    assert "torn" in caplog.text
    assert read_events(tmp_path / "missing.jsonl") == []


HELD_THEN_ARMED = """
import os, signal, sys
from air_hpc.resilience.signals import StopRequest, hold_stop_signals
hold_stop_signals()
os.kill(os.getpid(), signal.SIGUSR2)  # would kill the process without the hold
stop = StopRequest.install(["USR2"])
print(stop.signal_name)
"""


def test_a_stop_signal_before_the_handler_waits_for_it() -> None:
    done = subprocess.run([sys.executable, "-c", HELD_THEN_ARMED], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "SIGUSR2", done.stderr


def test_a_rank_arming_late_takes_the_stop_the_batch_shell_recorded(tmp_path: Path) -> None:
    stop = StopRequest()
    stop.announce_armed(tmp_path / "start", 3, "USR2")
    assert (tmp_path / "start" / "armed-3").exists() and not stop.requested
    (tmp_path / "start" / "stop_requested").touch()
    stop.announce_armed(tmp_path / "start", 4, "USR2")
    assert stop.requested and stop.signal_name == "SIGUSR2"


def test_every_configurable_stop_signal_is_held() -> None:
    assert {signal_number(n) for n in (*get_args(SignalName), *ALWAYS_STOP_ON)} == set(STOP_SIGNALS)
