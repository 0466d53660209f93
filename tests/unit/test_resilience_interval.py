"""``checkpoint.interval_steps: auto``: Daly's interval, the expected waste, the schedule, the config rules."""

import math
from pathlib import Path

import pytest

from air_hpc.config import load_job
from air_hpc.errors import ConfigError
from air_hpc.observe.records import RunRecords, parse_events, parse_steps
from air_hpc.observe.report import build_report, format_report
from air_hpc.resilience.interval import CheckpointSchedule, choose, daly_interval_s, expected_waste

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml"


def test_daly_is_youngs_square_root_refined_and_minimises_the_waste() -> None:
    cost, mtbf = 10.0, 24 * 3600.0
    tau = daly_interval_s(cost, mtbf)
    young = math.sqrt(2 * cost * mtbf)
    assert young - cost < tau < young * 1.01
    waste = expected_waste(cost, tau, mtbf)
    assert waste < expected_waste(cost, tau / 2, mtbf) and waste < expected_waste(cost, tau * 2, mtbf)


def test_a_save_longer_than_twice_the_mtbf_checkpoints_every_mtbf() -> None:
    assert daly_interval_s(100.0, 40.0) == 40.0
    assert daly_interval_s(0.0, 40.0) == 0.0


def test_choose_rounds_to_whole_steps_at_least_one() -> None:
    choice = choose(save_cost_s=0.5, step_time_s=0.25, mtbf_h=0.1)
    assert choice.steps == round(daly_interval_s(0.5, 360.0) / 0.25)
    assert choose(save_cost_s=0.001, step_time_s=10.0, mtbf_h=1.0).steps == 1
    assert 0 < choice.expected_waste < 1


def test_fixed_schedule_is_every_k_steps() -> None:
    schedule = CheckpointSchedule(3, None)
    assert [s for s in range(1, 10) if schedule.due(s, 0.1)] == [3, 6, 9]
    assert schedule.saved(3, 0.2) is None


def test_auto_schedule_measures_at_the_first_step_then_follows_the_choice() -> None:
    schedule = CheckpointSchedule("auto", mtbf_h=0.01)  # 36 s
    assert schedule.due(1, 0.5)
    choice = schedule.saved(1, save_cost_s=0.5)  # Daly: ~5.5 s of compute = 11 steps of 0.5 s
    assert choice is not None and choice.steps == round(daly_interval_s(0.5, 36.0) / 0.5)
    due = [s for s in range(2, 40) if schedule.due(s, 0.5)]
    assert due[0] == 1 + choice.steps
    assert schedule.saved(due[0], save_cost_s=0.5) is None  # unchanged choice: nothing new to log


def test_auto_without_mtbf_is_one_line_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"checkpoint\.interval_steps: auto needs resilience\.mtbf_h"):
        load_job(JOB, ["checkpoint.interval_steps=auto"])
    job = load_job(JOB, ["checkpoint.interval_steps=auto", "resilience.mtbf_h=0.5"])
    assert job.checkpoint.interval_steps == "auto" and job.resilience.mtbf_h == 0.5


@pytest.mark.parametrize("value", ["0", "often", "-3", "1.5"])
def test_bad_intervals_say_what_is_expected(value: str) -> None:
    with pytest.raises(ConfigError, match=r"checkpoint\.interval_steps: expected a whole number of steps >= 1 or auto"):
        load_job(JOB, [f"checkpoint.interval_steps={value}"])


def test_report_shows_expected_and_measured_loss() -> None:
    steps = parse_steps([{"step": s, "time": 100.0 + s, "step_time_s": 1.0, "loss": 1.0} for s in range(1, 11)])
    events = parse_events(
        [
            {"time": 100.0, "kind": "start", "generation": "1-0"},
            {"time": 102.5, "kind": "checkpoint_saved", "step": 2, "stall_s": 0.5, "seconds": 1.0},
            {
                "time": 102.6,
                "kind": "checkpoint_interval",
                "step": 2,
                "steps": 4,
                "save_cost_s": 0.5,
                "mtbf_h": 0.01,
                "expected_waste": 0.125,
            },
        ]
    )
    report = build_report(RunRecords(steps, events, (100.0,), 10, None))
    assert report is not None and report.auto_interval is not None
    assert report.auto_interval.measured_waste == pytest.approx(0.5 / report.wall_s)
    assert (
        "interval     auto: every 4 step(s) for a 0.50 s save and MTBF 0.01 h; loss to saves and redone work "
        "expected 12.5%, measured 5.0%" in format_report(report)
    )


def test_in_memory_snapshots_stretch_the_persistent_interval_by_the_failures_they_absorb() -> None:
    from air_hpc.resilience.interval import persistent_mtbf_h

    assert persistent_mtbf_h(10.0, memory_snapshots=False, spare_nodes=2, nodes=4) == 10.0
    assert persistent_mtbf_h(10.0, memory_snapshots=True, spare_nodes=0, nodes=4) == 10.0
    assert persistent_mtbf_h(10.0, memory_snapshots=True, spare_nodes=2, nodes=4) == 30.0
    assert persistent_mtbf_h(10.0, memory_snapshots=True, spare_nodes=2, nodes=1) == 10.0  # no buddy off the node
    cheap = choose(save_cost_s=2.0, step_time_s=1.0, mtbf_h=persistent_mtbf_h(1.0, True, 1, 2))
    assert cheap.steps > choose(save_cost_s=2.0, step_time_s=1.0, mtbf_h=1.0).steps


@pytest.mark.parametrize(
    ("step", "newest", "missed"),
    [
        (10, None, True),  # a ckpt-kill during the save of step 10, resumed from the snapshot of step 10
        (13, None, True),
        (13, 10, False),
        (20, 10, True),
        (9, None, False),  # no save was due yet
        (9, 3, False),
        (30, 20, False),  # the final step saves anyway
    ],
)
def test_a_periodic_save_missed_before_a_resume_from_memory_is_found(
    step: int, newest: int | None, missed: bool
) -> None:
    assert CheckpointSchedule(10, None).missed(step, newest, total_steps=30) is missed


def test_auto_intervals_miss_nothing_they_save_at_the_first_step_after_a_start() -> None:
    schedule = CheckpointSchedule("auto", 1.0)
    assert not schedule.missed(25, None, total_steps=30)
    assert schedule.due(26, 0.1)
