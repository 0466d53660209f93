"""Hang limits learned from the run: the pure derivation, the live limits of a rank, their file, the verdict."""

import json
import math
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from air_hpc.config.models import HealthConfig
from air_hpc.exitcodes import ExitCode
from air_hpc.health.heartbeat import Heartbeat, read_beats
from air_hpc.health.learning import LearnedLimits, caps_from_config, policy_from_config
from air_hpc.health.limits import (
    LIMITED_PHASES,
    MIN_SAMPLES,
    MIN_WARMUP_SAMPLES,
    SERIES,
    WARMUP_STEP,
    LearnPolicy,
    derive_limit,
    high_percentile,
)
from air_hpc.health.watchdog import PhaseLimits, Watchdog, overdue_s
from air_hpc.records.events import EventLog, read_events
from air_hpc.records.phase_times import MAX_SAMPLES, read_phase_times, write_phase_times

POLICY = LearnPolicy(enabled=True, factor=5.0, percentile=99.0, floor_s=30.0, warmup_steps=3)
CAPS = caps_from_config(HealthConfig())

samples_st = st.lists(st.floats(min_value=1e-4, max_value=1e5, allow_nan=False), min_size=0, max_size=300)
policy_st = st.builds(
    LearnPolicy,
    enabled=st.booleans(),
    factor=st.floats(min_value=1, max_value=20),
    percentile=st.floats(min_value=1, max_value=100),
    floor_s=st.floats(min_value=1, max_value=600),
    warmup_steps=st.integers(min_value=0, max_value=10),
)


def test_percentile_is_a_sample_and_the_maximum_while_samples_are_few() -> None:
    assert high_percentile([0.3, 0.1, 0.2], 99) == 0.3
    values = [float(v) for v in range(1, 201)]  # 1..200
    assert high_percentile(values, 99) == 198.0
    assert high_percentile(values, 50) == 100.0
    assert high_percentile([7.0], 1) == 7.0
    with pytest.raises(ValueError):
        high_percentile([], 99)


@given(phase=st.sampled_from(LIMITED_PHASES), samples=samples_st, cap=st.floats(1, 1e5), policy=policy_st)
@settings(max_examples=400, deadline=None)
def test_a_limit_is_never_above_its_cap_nor_below_the_floor_once_learned(
    phase: str, samples: list[float], cap: float, policy: LearnPolicy
) -> None:
    limit = derive_limit(phase, samples, cap, policy)  # type: ignore[arg-type]
    assert 0 < limit.limit_s <= cap
    assert limit.samples == len(samples)
    if not policy.enabled or len(samples) < MIN_SAMPLES[phase]:  # type: ignore[index]
        assert (limit.source, limit.limit_s) == ("configured", cap)
        assert limit.why_configured
        return
    assert limit.observed_s is not None and limit.observed_s in samples
    assert limit.limit_s == min(cap, max(policy.floor_s, policy.factor * limit.observed_s))
    assert limit.source == ("learned" if limit.limit_s < cap else "capped")
    if limit.source == "learned":
        assert limit.limit_s >= policy.floor_s
        # most of what was seen fits with the headroom: no false alarm on the run's own normal times
        assert sum(s <= limit.limit_s for s in samples) >= math.floor(policy.percentile / 100 * len(samples))
    assert limit.describe().startswith(f"{phase} limit ")


@given(samples=samples_st, extra=st.floats(1e-4, 1e5), policy=policy_st)
@settings(max_examples=200, deadline=None)
def test_a_longer_sample_never_shortens_a_limit(samples: list[float], extra: float, policy: LearnPolicy) -> None:
    """Monotone: seeing a slower save can only widen the save limit (replacing a sample by a longer one)."""
    if not samples:
        return
    before = derive_limit("save", samples, 900, policy)
    slower = [*samples[:-1], max(samples[-1], extra)]
    assert derive_limit("save", slower, 900, policy).limit_s >= before.limit_s


def test_each_derivation_says_what_it_is() -> None:
    saves = [0.4, 0.3, 0.5, 0.2]
    learned = derive_limit("save", saves, 900, POLICY)
    assert (learned.source, learned.limit_s, learned.observed_s) == ("learned", 30.0, 0.5)
    assert learned.describe() == (
        "save limit 30 s, learned: max(floor 30 s, 5 x p99 0.5 s of 4 save samples), "
        "under the configured 900 s (health.heartbeat_checkpoint_s)"
    )
    steps = [20.0] * 30
    assert derive_limit("step", steps, 300, POLICY).limit_s == 100.0
    capped = derive_limit("step", [90.0] * 30, 300, POLICY)
    assert (capped.source, capped.limit_s) == ("capped", 300)
    assert "the configured cap (health.heartbeat_step_s): learned max(floor 30 s, 5 x p99 90 s" in capped.describe()
    few = derive_limit("load", [1.0], 900, POLICY)
    assert few.describe() == (
        "load limit 900 s, configured (health.heartbeat_checkpoint_s): 1 of the 3 samples needed to learn"
    )
    off = derive_limit("setup", [1.0] * 10, 600, LearnPolicy(enabled=False))
    assert "learning is off (health.learn_limits)" in off.describe() and off.limit_s == 600
    warming = derive_limit("step", [0.1] * 50, 300, POLICY, warming_up="warming up (1 of 3)")
    assert (warming.source, warming.limit_s) == ("configured", 300) and "warming up (1 of 3)" in warming.describe()


def test_the_config_gives_caps_and_policy() -> None:
    health = HealthConfig(heartbeat_setup_s=60, heartbeat_step_s=10, heartbeat_checkpoint_s=30, learned_limit_floor_s=5)
    assert caps_from_config(health) == {"setup": 60, "load": 30, "step": 10, "save": 30, "sync_save": 30}
    policy = policy_from_config(health)
    assert (policy.enabled, policy.floor_s, policy.factor, policy.percentile) == (True, 5.0, 5.0, 99.0)


def test_steps_learn_after_the_warm_up_of_each_start() -> None:
    limits = LearnedLimits(CAPS, POLICY, {})
    for _ in range(POLICY.warmup_steps - 1):
        limits.observe("step", 40.0)  # the first steps compile: slow, and not samples
    step = limits.limit("step")
    assert step is not None and step.source == "configured" and "warming up (2 of" in step.why_configured
    limits.observe("step", 40.0)
    assert limits.samples("step") == ()
    for _ in range(MIN_SAMPLES["step"]):
        limits.observe("step", 0.5)
    step = limits.limit("step")
    assert step is not None and (step.source, step.limit_s, step.samples) == ("learned", 30.0, 20)
    restarted = LearnedLimits(CAPS, POLICY, {"step": limits.samples("step")})
    assert restarted.limit_s("step") == 300  # a new start warms up again, keeping what it learned
    for _ in range(POLICY.warmup_steps):
        restarted.observe("step", 60.0)
    assert restarted.limit_s("step") == 30.0


def test_phases_without_a_limit_and_odd_times_are_ignored() -> None:
    limits = LearnedLimits(CAPS, POLICY, {})
    limits.observe("done", 5.0)
    limits.observe("save", -1.0)
    limits.observe("save", 0.0)
    assert limits.limit("done") is None and limits.samples("save") == ()
    assert limits.shortest_s == 30.0
    assert LearnedLimits(CAPS, LearnPolicy(enabled=False), {}).shortest_s == 300


def test_limits_are_kept_across_starts_by_rank_0(tmp_path: Path) -> None:
    store = tmp_path / "phase_times.json"
    health = HealthConfig()
    first = LearnedLimits.for_rank(health, store, rank=0)
    for seconds in (4.0, 5.0, 6.0):
        first.observe("setup", seconds)
        first.observe("save", seconds / 10)
    other = LearnedLimits.for_rank(health, store, rank=1)
    other.observe("load", 3.0)  # only rank 0 writes
    assert read_phase_times(store, LIMITED_PHASES)["setup"] == (4.0, 5.0, 6.0)
    assert read_phase_times(store, LIMITED_PHASES)["load"] == ()
    again = LearnedLimits.for_rank(health, store, rank=3)
    setup = again.limit("setup")
    assert setup is not None and (setup.source, setup.limit_s, setup.observed_s) == ("learned", 30.0, 6.0)
    assert again.limit_s("save") == 30.0 and again.limit_s("sync_save") == 900
    off = LearnedLimits.for_rank(HealthConfig(learn_limits=False), store, rank=0)
    assert off.limit_s("setup") == 600 and off.store is None


def test_only_the_newest_samples_are_kept(tmp_path: Path) -> None:
    limits = LearnedLimits(CAPS, POLICY, {"save": [100.0] * MAX_SAMPLES})
    assert limits.limit_s("save") == 500.0
    for _ in range(MAX_SAMPLES):
        limits.observe("save", 1.0)  # the slow saves age out
    assert limits.limit_s("save") == 30.0 and len(limits.samples("save")) == MAX_SAMPLES


def test_the_phase_times_file_is_untrusted(tmp_path: Path) -> None:
    path = tmp_path / "phase_times.json"
    assert read_phase_times(path, LIMITED_PHASES) == {p: () for p in LIMITED_PHASES}
    path.write_bytes(b"\xff not json")
    assert read_phase_times(path, LIMITED_PHASES)["step"] == ()
    path.write_text(json.dumps(["not", "an", "object"]))
    assert read_phase_times(path, LIMITED_PHASES)["step"] == ()
    odd = {"step": [1, "2", None, True, -3, 0, float("inf"), 2.5], "save": "fast", "nap": [1.0]}
    path.write_text(json.dumps({"phases": odd}).replace("Infinity", "1e999"))
    times = read_phase_times(path, LIMITED_PHASES)
    assert times["step"] == (1.0, 2.5) and times["save"] == () and "nap" not in times
    write_phase_times(path, {"step": [0.1] * (MAX_SAMPLES + 7)})
    assert len(read_phase_times(path, LIMITED_PHASES)["step"]) == MAX_SAMPLES
    link = tmp_path / "linked.json"
    link.symlink_to(tmp_path / "elsewhere.json")
    limits = LearnedLimits(CAPS, POLICY, {}, store=link)
    limits.observe("save", 1.0)  # refused and warned about, never followed; training goes on
    assert not (tmp_path / "elsewhere.json").exists()


def test_the_heartbeat_reports_each_silent_interval(tmp_path: Path) -> None:
    seen: list[tuple[str, float]] = []
    clock = iter([0.0, 8.0, 9.5, 10.0, 10.25, 12.0, 13.0]).__next__
    hb = Heartbeat(tmp_path, rank=0, host="n1", clock=clock, observer=lambda p, s: seen.append((p, s)))
    hb.beat("load", 0)
    hb.beat("step", 1)
    hb.beat("step", 2)
    hb.beat("save", 2)
    hb.beat("done")
    hb.beat("done")
    assert seen == [("setup", 8.0), ("load", 1.5), ("step", 0.5), ("step", 0.25), ("save", 1.75)]


def test_beat_files_of_the_old_checkpoint_phase_read_as_saves(tmp_path: Path) -> None:
    (tmp_path / "rank-00000.json").write_text(
        json.dumps({"rank": 0, "host": "n1", "pid": 1, "phase": "checkpoint", "step": 3, "time_s": 1.0})
    )
    assert read_beats(tmp_path)[0].phase == "save"


def test_fixed_limits_cover_every_phase() -> None:
    fixed = PhaseLimits(setup_s=60, step_s=10, checkpoint_s=30)
    assert [fixed.limit_s(p) for p in LIMITED_PHASES] == [60, 30, 10, 30, 30]
    limit = fixed.limit("sync_save")
    assert limit is not None and limit.source == "configured" and "fixed limits" in limit.describe()
    assert fixed.limit("done") is None


def test_a_rank_frozen_in_a_save_is_caught_at_the_learned_limit_and_the_verdict_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Saves of a fraction of a second learned a 1 s limit (floor 1 s here) under a 900 s cap."""
    policy = LearnPolicy(enabled=True, factor=5.0, percentile=99.0, floor_s=1.0, warmup_steps=0)
    limits = LearnedLimits(CAPS, policy, {"save": [0.05, 0.08, 0.1]})
    directory = tmp_path / "heartbeat" / "7-0"
    hb = Heartbeat(directory, rank=0, host="n5", observer=limits.observe)
    events = tmp_path / "events.jsonl"
    exited: list[int] = []
    done = threading.Event()

    def fake_exit(code: int) -> None:
        exited.append(code)
        done.set()

    hb.beat("save", 12)
    assert overdue_s(hb.last, hb.last.time_s + 0.9, limits) is None
    assert overdue_s(hb.last, hb.last.time_s + 901, PhaseLimits.from_config(HealthConfig())) is not None
    dog = Watchdog(
        hb,
        limits,
        world_size=1,
        log_path=tmp_path / "rank-0.log",
        bad_nodes_path=tmp_path / "bad_nodes.txt",
        events=EventLog(events),
        poll_s=0.05,
        grace_s=0.1,
        exit_process=fake_exit,
    )
    started = time.monotonic()
    with dog:
        assert done.wait(30), "the watchdog did not fire"
    assert time.monotonic() - started >= 1.0  # never before the learned limit
    assert exited == [ExitCode.HUNG]
    (hang,) = read_events(events)
    assert (hang["phase"], hang["step"], hang["limit_s"]) == ("save", 12, 1.0)
    assert hang["limit"] == (
        "save limit 1 s, learned: max(floor 1 s, 5 x p99 0.1 s of 3 save samples), "
        "under the configured 900 s (health.heartbeat_checkpoint_s)"
    )
    assert any(
        "made no progress in save" in r.message and "save limit 1 s, learned" in r.message for r in caplog.records
    )


def test_step_samples_are_kept_at_once_until_the_step_limit_is_learned(tmp_path: Path) -> None:
    """Starts that each live a few steps (in-job restarts seconds apart) learn the step limit together."""
    store = tmp_path / "phase_times.json"
    now = [0.0]
    for _start in range(4):  # each start: the warm-up, then 6 steps, then a kill -9 (no persist() at the end)
        limits = LearnedLimits(CAPS, POLICY, read_phase_times(store, LIMITED_PHASES), store, clock=lambda: now[0])
        for _ in range(POLICY.warmup_steps + 6):
            limits.observe("step", 0.5)
    assert len(read_phase_times(store, LIMITED_PHASES)["step"]) == 20  # kept at once until the 20 needed
    learned = LearnedLimits(CAPS, POLICY, read_phase_times(store, LIMITED_PHASES), store, clock=lambda: now[0])
    for _ in range(POLICY.warmup_steps + 5):
        learned.observe("step", 0.5)
    step = learned.limit("step")
    assert step is not None and step.source == "learned" and step.limit_s == 30.0
    assert len(read_phase_times(store, LIMITED_PHASES)["step"]) == 20  # learned: periodic writes again


def test_the_step_limit_of_a_warm_up_is_learned_from_earlier_warm_ups() -> None:
    warming = "warming up (0 of this start's first 3 steps done)"
    few = derive_limit("step", [0.1] * 50, 300, POLICY, warming, warmup_samples=[4.0, 0.5])
    assert (few.source, few.limit_s) == ("configured", 300)
    assert few.describe() == (
        f"step limit 300 s, configured (health.heartbeat_step_s): {warming}; "
        f"2 of the {MIN_WARMUP_SAMPLES} warm-up step samples needed to learn"
    )
    learned = derive_limit("step", [0.1] * 50, 300, POLICY, warming, warmup_samples=[12.0, 0.5, 0.4])
    assert (learned.source, learned.limit_s, learned.observed_s, learned.warmup) == ("learned", 60.0, 12.0, True)
    assert learned.describe() == (
        "step limit 60 s, learned: max(floor 30 s, 5 x p99 12 s of 3 warm-up step samples), "
        "under the configured 300 s (health.heartbeat_step_s)"
    )
    # past the warm-up, with too few steps after warm-ups yet, the warm-up steps bound the step too
    early = derive_limit("step", [0.1] * 5, 300, POLICY, warmup_samples=[12.0, 0.5, 0.4])
    assert (early.source, early.limit_s, early.warmup) == ("learned", 60.0, True)
    # enough steps: they decide, the slower warm-up steps no longer
    assert derive_limit("step", [0.1] * 20, 300, POLICY, warmup_samples=[12.0, 0.5, 0.4]).warmup is False
    # only the step has warm-up samples
    assert derive_limit("load", [1.0], 900, POLICY, warmup_samples=[1.0] * 5).source == "configured"


def test_a_restart_watches_its_warm_up_with_the_limit_the_starts_before_it_learned(tmp_path: Path) -> None:
    """In-job restarts seconds apart: each start's warm-up steps are kept at once, so the next start's first
    step (its slowest, and where a frozen rank was caught only at the configured cap) has a learned limit."""
    store = tmp_path / "phase_times.json"
    first = LearnedLimits(CAPS, POLICY, read_phase_times(store, SERIES), store)
    before = first.limit("step")
    assert before is not None and before.source == "configured" and "0 of the 3 warm-up" in before.describe()
    for seconds in (8.0, 0.6, 0.5):  # the warm-up, then a kill -9: nothing written at the end
        first.observe("step", seconds)
    assert read_phase_times(store, SERIES)[WARMUP_STEP] == (8.0, 0.6, 0.5)
    assert read_phase_times(store, SERIES)["step"] == ()  # warm-up steps are not step samples
    restarted = LearnedLimits(CAPS, POLICY, read_phase_times(store, SERIES), store)
    step = restarted.limit("step")
    assert step is not None and (step.source, step.limit_s, step.warmup) == ("learned", 40.0, True)
    assert "5 x p99 8 s of 3 warm-up step samples" in step.describe()
    off = LearnedLimits(CAPS, LearnPolicy(enabled=False), read_phase_times(store, SERIES), store)
    assert off.limit_s("step") == CAPS["step"]


def test_a_silence_that_reached_its_limit_is_no_sample() -> None:
    """Ranks waiting in a collective for a frozen peer beat again once the hang is ended: that step is a hang, and
    learning it would have raised the next warm-up's step limit from 30 s to 5 x 40.6 s (seen in a campaign)."""
    limits = LearnedLimits(CAPS, POLICY, {WARMUP_STEP: [0.2, 0.3, 0.25], "save": [0.1, 0.1, 0.2]})
    assert limits.limit_s("step") == 30.0 and limits.limit_s("save") == 30.0
    limits.observe("step", 40.6)
    limits.observe("save", 30.0)
    assert limits.limit_s("step") == 30.0 and limits.limit_s("save") == 30.0
    assert limits.samples(WARMUP_STEP) == (0.2, 0.3, 0.25) and limits.samples("save") == (0.1, 0.1, 0.2)
    limits.observe("step", 29.0)  # under the limit: slow, but a step
    assert limits.samples(WARMUP_STEP)[-1] == 29.0
