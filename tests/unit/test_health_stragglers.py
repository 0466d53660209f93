"""Straggler detection: the pure detector, the busy-time meter, the per-window report, status and report."""

import json
from pathlib import Path
from types import FrameType

import pytest

from air_hpc.config import load_job
from air_hpc.config.models import HealthConfig
from air_hpc.errors import ConfigError
from air_hpc.health.badnodes import read_bad_nodes
from air_hpc.health.busy import BusyMeter
from air_hpc.health.stragglers import find_stragglers
from air_hpc.observe.progress import run_progress
from air_hpc.observe.records import load_records
from air_hpc.observe.report import build_report, format_report
from air_hpc.records.events import EventLog, read_events
from air_hpc.records.rundir import RunDir
from air_hpc.train.straggler_watch import StragglerWatch

REPO = Path(__file__).resolve().parents[2]
HOSTS = ["n1", "n1", "n2", "n2"]


def test_one_slow_node_of_two_is_found_with_its_slow_ranks() -> None:
    times = [[0.10] * 5, [0.11] * 5, [0.30] * 5, [0.12] * 5]
    (straggler,) = find_stragglers(times, HOSTS, ratio=1.5)
    assert straggler.node == "n2" and straggler.ranks == (2,)
    assert straggler.busy_s == pytest.approx(0.30)
    assert straggler.reference_s == pytest.approx(0.11)
    assert "n2 (rank(s) 2)" in straggler.describe() and "2.7x" in straggler.describe()


def test_differences_within_the_ratio_are_not_stragglers() -> None:
    times = [[0.10] * 5, [0.10] * 5, [0.14] * 5, [0.14] * 5]
    assert find_stragglers(times, HOSTS, ratio=1.5) == ()


def test_a_few_slow_steps_do_not_make_a_straggler() -> None:
    spiky = [0.1, 0.1, 0.1, 0.9, 0.9]
    assert find_stragglers([[0.1] * 5, [0.1] * 5, spiky, [0.1] * 5], HOSTS, ratio=1.5) == ()


def test_one_node_has_nothing_to_compare_with() -> None:
    assert find_stragglers([[0.1] * 3, [5.0] * 3], ["n1", "n1"], ratio=1.5) == ()


def test_the_slow_node_among_many_is_found_and_only_it() -> None:
    hosts = [f"n{i}" for i in range(1, 9)]
    times = [[0.1] * 4 for _ in hosts]
    times[5] = [0.4] * 4
    assert [s.node for s in find_stragglers(times, hosts, ratio=2.0)] == ["n6"]


def test_times_and_hosts_must_match() -> None:
    with pytest.raises(ValueError, match="3 ranks' step times but 4 host names"):
        find_stragglers([[0.1]] * 3, HOSTS, ratio=1.5)


def _frame_in(path: str) -> FrameType:
    namespace: dict[str, FrameType] = {}
    exec(compile("import sys\nframe = sys._getframe()", path, "exec"), namespace)
    return namespace["frame"]


def test_meter_counts_work_and_stalls_but_not_waiting_for_other_ranks() -> None:
    now = [0.0]
    frame = [_frame_in("/site-packages/megatron/core/transformer/attention.py")]
    meter = BusyMeter(interval_s=0.01, clock=lambda: now[0], frame_of=lambda: frame[0])
    now[0] = 0.01
    meter.sample()
    assert meter.busy_s() == pytest.approx(0.01)
    frame[0] = _frame_in("/site-packages/torch/distributed/distributed_c10d.py")
    now[0] = 0.02
    meter.sample()
    assert meter.busy_s() == pytest.approx(0.01)
    # Stopped (SIGSTOP) for 0.5 s while waiting: this process could not run, which is its own slowness.
    now[0] = 0.52
    meter.sample()
    assert meter.busy_s() == pytest.approx(0.01 + 0.48)


def test_meter_thread_measures_a_busy_main_thread() -> None:
    meter = BusyMeter(interval_s=0.002).start()
    try:
        deadline = meter._clock() + 0.2
        while meter._clock() < deadline:
            sum(range(1000))
    finally:
        meter.stop()
    assert 0.1 < meter.busy_s() < 0.5


class _Idle(BusyMeter):
    def start(self) -> "BusyMeter":
        return self


def _watch(tmp_path: Path, exclude: bool, rows: list[list[float]]) -> tuple[StragglerWatch, RunDir]:
    run = RunDir(tmp_path)
    health = HealthConfig(straggler_window_steps=2, straggler_ratio=1.5, exclude_stragglers=exclude)
    watch = StragglerWatch(
        health, 0, "n1", EventLog(run.events), run.bad_nodes, _Idle(), lambda _: rows, lambda _: HOSTS
    )
    return watch, run


@pytest.mark.parametrize("exclude", [True, False])
def test_rank_zero_reports_a_straggler_once_and_lists_it_when_asked(tmp_path: Path, exclude: bool) -> None:
    rows = [[0.1, 0.1], [0.1, 0.1], [0.5, 0.6], [0.1, 0.1]]
    watch, run = _watch(tmp_path, exclude, rows)
    found = [watch.end(step) for step in range(1, 7)]
    assert [bool(f) for f in found] == [False, False, False, True, False, True]  # the 2nd window in a row reports
    events = [e for e in read_events(run.events) if e["kind"] == "straggler"]
    assert len(events) == 1
    assert events[0]["node"] == "n2" and events[0]["step"] == 4 and events[0]["ranks"] == [2]
    assert events[0]["windows"] == 2
    assert events[0]["excluded"] is exclude
    assert read_bad_nodes(run.bad_nodes) == (("n2",) if exclude else ())


def test_one_slow_window_is_not_a_straggler(tmp_path: Path) -> None:
    """Issue 24 item 8: a verdict needs health.straggler_windows windows in a row (2 by default)."""
    slow, clean = [[0.1, 0.1], [0.1, 0.1], [0.5, 0.6], [0.1, 0.1]], [[0.1, 0.1]] * 4
    windows = [slow, clean, slow, clean, slow]
    run = RunDir(tmp_path)
    health = HealthConfig(straggler_window_steps=2, straggler_ratio=1.5)
    watch = StragglerWatch(
        health, 0, "n1", EventLog(run.events), run.bad_nodes, _Idle(), lambda _: windows.pop(0), lambda _: HOSTS
    )
    assert not any(watch.end(step) for step in range(1, 11))
    assert not [e for e in read_events(run.events) if e["kind"] == "straggler"]


def test_a_node_within_the_runs_own_noise_is_not_a_straggler() -> None:
    """1.6x the others' median, but their own steps vary by more than that: noise, not a straggler."""
    noisy = [0.05, 0.15, 0.1, 0.2, 0.06, 0.14, 0.1, 0.18]
    times = [noisy, noisy[::-1], [0.19] * 8, [0.1] * 8]
    assert find_stragglers(times, HOSTS, ratio=1.5, noise_sigmas=4.0) == ()
    (flagged,) = find_stragglers(times, HOSTS, ratio=1.5, noise_sigmas=0.0)  # the ratio alone: a false alarm
    assert flagged.node == "n2" and flagged.noise_s > 0.05
    steady = [[0.1] * 8, [0.1] * 8, [0.17] * 8, [0.1] * 8]  # the same 1.7x over steady nodes is found
    assert [s.node for s in find_stragglers(steady, HOSTS, ratio=1.5, noise_sigmas=4.0)] == ["n2"]


def test_status_and_report_name_the_straggler(tmp_path: Path) -> None:
    job = load_job(REPO / "configs/jobs/gpt-tiny-local.yaml", [f"run.root={tmp_path}"])
    run = RunDir.of(job)
    run.write_job(job)
    run.metrics.write_text(json.dumps({"step": 1, "loss": 5.0, "step_time_s": 1.0, "time": 1001.0}) + "\n")
    events = [
        {"time": 1000.0, "kind": "start"},
        {"time": 1000.9, "kind": "startup", "to_first_step_s": 6.5},
        {"time": 1001.0, "kind": "straggler", "node": "n2", "step": 1, "ratio": 3.2, "excluded": True},
    ]
    run.events.write_text("".join(json.dumps(e) + "\n" for e in events))
    records = load_records(run)
    progress = run_progress(records, 1002.0)
    assert progress is not None and progress.stragglers == ("n2",)
    assert progress.describe().endswith("straggler(s) n2")
    report = build_report(records)
    assert report is not None
    text = format_report(report)
    assert "straggler    n2 at step 1, 3.2x the others; on the bad-node list" in text
    assert "start-ups    6.5 s from process creation to first step, per start" in text


@pytest.mark.parametrize(
    ("override", "fragment"),
    [("health.straggler_ratio=1", "health.straggler_ratio"), ("health.straggler_window_steps=-1", "straggler_window")],
)
def test_bad_straggler_settings_name_the_key(override: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        load_job(REPO / "configs/jobs/gpt-tiny-local.yaml", [override])
