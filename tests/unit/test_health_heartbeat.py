import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from air_hpc.config.models import HealthConfig
from air_hpc.exitcodes import ExitCode
from air_hpc.health.badnodes import read_bad_nodes
from air_hpc.health.heartbeat import Beat, Heartbeat, read_beats
from air_hpc.health.watchdog import (
    PhaseLimits,
    StallReport,
    Watchdog,
    choose_suspects,
    innermost_location,
    overdue_s,
    poll_interval_s,
    stall_path,
)
from air_hpc.records.events import EventLog, read_events
from air_hpc.records.generation import generation, read_exit_code, write_exit_code

LIMITS = PhaseLimits(setup_s=60, step_s=10, checkpoint_s=30)


def beat(rank: int, step: int = 5, phase: str = "step", time_s: float = 100.0, host: str = "") -> Beat:
    return Beat(rank, host or f"n{rank + 1}", 1000 + rank, phase, step, time_s)  # type: ignore[arg-type]


def report(rank: int, waiting: bool) -> StallReport:
    return StallReport(rank, f"n{rank + 1}", "step", 5, 12.0, waiting, "somewhere")


def test_generation_names_one_start_of_the_job() -> None:
    assert generation({"SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "2"}) == "42-2"
    assert generation({"SLURM_JOB_ID": "42"}) == "42-0"
    assert generation({"SUBMITIT_LOCAL_JOB_ID": "777"}) == "777-0"
    assert generation({}) == "local-0"


def test_beats_are_written_and_read_back(tmp_path: Path) -> None:
    clock = iter([10.0, 11.0, 12.5]).__next__
    hb = Heartbeat(tmp_path / "hb", rank=3, host="n4", clock=clock)
    assert (hb.last.phase, hb.last.step, hb.last.time_s) == ("setup", 0, 10.0)
    hb.beat("step", 7)
    hb.beat("save")
    beats = read_beats(tmp_path / "hb")
    assert list(beats) == [3]
    assert (beats[3].phase, beats[3].step, beats[3].time_s, beats[3].host) == ("save", 7, 12.5, "n4")
    assert beats[3] == hb.last
    with pytest.raises(ValueError, match="heartbeat phase 'nap'"):
        hb.beat("nap")  # type: ignore[arg-type]


def test_beat_files_are_throttled_but_phase_changes_always_written(tmp_path: Path) -> None:
    times = iter([0.0, 1.0, 2.0, 5.0, 11.5, 12.0]).__next__
    hb = Heartbeat(tmp_path, rank=0, host="n1", clock=times, file_interval_s=10)

    def on_file() -> tuple[str, int]:
        beat = read_beats(tmp_path)[0]
        return beat.phase, beat.step

    hb.beat("step", 1)
    assert on_file() == ("step", 1)
    hb.beat("step", 2)
    hb.beat("step", 3)
    assert on_file() == ("step", 1) and hb.last.step == 3
    hb.beat("step", 4)
    assert on_file() == ("step", 4)
    hb.beat("save")
    assert on_file() == ("save", 4)
    hb.flush()
    assert read_beats(tmp_path)[0] == hb.last


def test_unreadable_beat_files_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "rank-00000.json").write_text("{not json")
    (tmp_path / "rank-00001.json").write_text(json.dumps({**beat(1).__dict__, "phase": "nap"}))
    (tmp_path / "rank-00002.json").write_text(beat(2).to_json())
    assert list(read_beats(tmp_path)) == [2]


def test_first_verdict_wins(tmp_path: Path) -> None:
    assert read_exit_code(tmp_path / "g") is None
    assert write_exit_code(tmp_path / "g", ExitCode.UNHEALTHY)
    assert not write_exit_code(tmp_path / "g", ExitCode.HUNG)
    assert read_exit_code(tmp_path / "g") == ExitCode.UNHEALTHY


def test_limits_per_phase() -> None:
    limits = PhaseLimits.from_config(HealthConfig(heartbeat_setup_s=60, heartbeat_step_s=10, heartbeat_checkpoint_s=30))
    assert limits == LIMITS
    assert overdue_s(beat(0, phase="step"), 109.0, LIMITS) is None
    assert overdue_s(beat(0, phase="step"), 112.0, LIMITS) == pytest.approx(2.0)
    assert overdue_s(beat(0, phase="save"), 112.0, LIMITS) is None
    assert overdue_s(beat(0, phase="load"), 131.0, LIMITS) == pytest.approx(1.0)
    assert overdue_s(beat(0, phase="setup"), 165.0, LIMITS) == pytest.approx(5.0)
    assert overdue_s(beat(0, phase="done"), 1e9, LIMITS) is None
    assert poll_interval_s(LIMITS) == 1.0
    assert poll_interval_s(PhaseLimits(2, 2, 2)) == 0.5
    assert poll_interval_s(PhaseLimits(600, 300, 900)) == 10.0


def test_the_busy_rank_is_the_suspect() -> None:
    beats = {r: beat(r) for r in range(4)}
    reports = {0: report(0, True), 1: report(1, True), 2: report(2, False), 3: report(3, True)}
    suspects = choose_suspects(beats, reports, 4)
    assert (suspects.ranks, suspects.hosts) == ((2,), ("n3",))
    assert "rank(s) 2 busy outside any collective" in suspects.why


def test_a_rank_that_did_not_report_is_a_suspect() -> None:
    beats = {r: beat(r, host="n1" if r < 2 else "n2") for r in range(4)}
    reports = {0: report(0, True), 1: report(1, True)}
    suspects = choose_suspects(beats, reports, 4)
    assert (suspects.ranks, suspects.hosts) == ((2, 3), ("n2",))
    assert "did not report" in suspects.why


def test_when_everyone_waits_the_ranks_behind_are_suspects() -> None:
    beats = {0: beat(0, step=9), 1: beat(1, step=8), 2: beat(2, step=9)}
    reports = {r: report(r, True) for r in range(3)}
    assert choose_suspects(beats, reports, 3).hosts == ("n2",)
    same = {r: beat(r, step=9) for r in range(3)}
    suspects = choose_suspects(same, reports, 3)
    assert suspects.hosts == () and "no suspect node" in suspects.why


def test_innermost_frame_inside_torch_distributed_is_waiting() -> None:
    namespace: dict[str, object] = {}
    code = compile("import sys\ndef wait():\n    return sys._getframe()\n", "/venv/torch/distributed/c10d.py", "exec")
    exec(code, namespace)
    frame = namespace["wait"]()  # type: ignore[operator]
    waiting, where = innermost_location(frame)
    assert waiting and where == "/venv/torch/distributed/c10d.py:3 in wait"
    waiting, where = innermost_location(sys._getframe())
    assert not waiting and "test_innermost_frame_inside_torch_distributed_is_waiting" in where
    assert innermost_location(None)[0] is False


def test_watchdog_dumps_stacks_records_the_node_and_exits_hung(tmp_path: Path) -> None:
    directory = tmp_path / "heartbeat" / "7-0"
    hb = Heartbeat(directory, rank=0, host="n5")
    # Rank 1 waits in a collective for rank 0: its report must not make it a suspect.
    other = directory / "rank-00001.json"
    other.write_text(beat(1, host="n6", time_s=time.time()).to_json())
    stall_path(directory, 1).write_text(json.dumps(report(1, True).__dict__ | {"host": "n6"}))
    exited: list[int] = []
    done = threading.Event()

    def fake_exit(code: int) -> None:
        exited.append(code)
        done.set()

    log_path = tmp_path / "logs" / "rank-0.log"
    bad = tmp_path / "bad_nodes.txt"
    events = tmp_path / "events.jsonl"
    hb.beat("step", 3)
    started = time.monotonic()
    dog = Watchdog(
        hb,
        PhaseLimits(setup_s=5, step_s=0.5, checkpoint_s=5),
        world_size=2,
        log_path=log_path,
        bad_nodes_path=bad,
        events=EventLog(events),
        poll_s=0.05,
        grace_s=0.2,
        exit_process=fake_exit,
    )
    with dog:
        assert done.wait(5), "the watchdog did not fire"
    took = time.monotonic() - started
    assert exited == [ExitCode.HUNG]
    assert took >= 0.5, took  # never before the step limit (how soon after is load-dependent)
    text = log_path.read_text()
    assert "Python stacks of all threads of rank 0" in text
    assert "air-hpc-watchdog" in text or "Thread 0x" in text
    assert "test_watchdog_dumps_stacks_records_the_node_and_exits_hung" in text
    assert read_bad_nodes(bad) == ("n5",)
    (hang,) = read_events(events)
    assert hang["kind"] == "hang" and hang["step"] == 3 and hang["suspect_nodes"] == ["n5"]
    assert hang["suspect_ranks"] == [0]
    assert read_exit_code(directory) == ExitCode.HUNG


def test_a_rank_making_progress_is_left_alone(tmp_path: Path) -> None:
    hb = Heartbeat(tmp_path / "hb", rank=0, host="n1")
    exited: list[int] = []
    dog = Watchdog(
        hb,
        PhaseLimits(setup_s=0.3, step_s=0.3, checkpoint_s=0.3),
        world_size=1,
        log_path=tmp_path / "rank-0.log",
        bad_nodes_path=tmp_path / "bad_nodes.txt",
        events=None,
        poll_s=0.05,
        exit_process=exited.append,
    )
    with dog:
        for step in range(1, 9):
            hb.beat("step", step)
            time.sleep(0.1)
        hb.beat("done")
        time.sleep(0.5)
    assert exited == []
    assert not (tmp_path / "bad_nodes.txt").exists()


def test_exit_hung_takes_the_children_along(tmp_path: Path) -> None:
    """In a process of its own: orphaned children would keep a Slurm step alive."""
    script = (
        "import subprocess, sys\n"
        "from air_hpc.health.watchdog import exit_hung\n"
        "child = subprocess.Popen(['sleep', '60'])\n"
        "print(child.pid, flush=True)\n"
        "exit_hung(86)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == ExitCode.HUNG, done.stderr
    child = int(done.stdout.split()[0])
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
