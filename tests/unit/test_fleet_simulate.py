"""``fleet simulate``'s pure parts: the seeded plan, its fit on a testbed, the ground truth's reading of records."""

import json
from pathlib import Path

import pytest

from air_hpc.errors import UserError
from air_hpc.fleet.simulate import (
    MIN_JOBS,
    PlannedJob,
    Submitted,
    check_plan_fits,
    plan_workload,
    write_truth,
)
from air_hpc.fleet.truth import job_truth, read_mark, training_starts
from air_hpc.testbed.tenants import SYSTEM_USERS
from tests.conftest import RunMain


def test_the_same_seed_gives_the_same_workload_and_another_seed_another() -> None:
    assert plan_workload(12, 5) == plan_workload(12, 5)
    assert plan_workload(12, 5) != plan_workload(12, 6)


@pytest.mark.parametrize("jobs", [MIN_JOBS, 7, 9, 14, 40])
def test_every_workload_mixes_tenants_qos_preemptors_other_users_and_a_failure(jobs: int) -> None:
    planned = plan_workload(jobs, 3)
    assert len(planned) == jobs and len({p.name for p in planned}) == jobs
    trainings = [p for p in planned if p.kind == "training"]
    assert {(p.account, p.qos) for p in trainings[:3]} == {
        ("research", "scavenger"),
        ("product", "high"),
        ("ops", "normal"),
    }
    scavengers = {p.name for p in trainings if p.qos == "scavenger"}
    preemptors = [p for p in planned if p.kind == "preemptor"]
    assert {p.victim for p in preemptors} == scavengers and all(p.qos == "high" for p in preemptors)
    assert all(p.expected_preemptions == (p.name in scavengers) for p in trainings)
    others = [p for p in planned if p.kind in ("short", "failure", "cancelled")]
    assert others and all(p.user in SYSTEM_USERS and p.qos == "normal" for p in others)
    assert [p.expected_state for p in planned if p.kind == "failure"] == ["FAILED"]
    assert [p.kind for p in planned].count("cancelled") == (1 if jobs > MIN_JOBS else 0)
    assert len(trainings) <= 6
    crashed = [p for p in trainings if p.crash_after_step]
    assert [(p.account, p.qos) for p in crashed] == ([("ops", "normal")] if jobs >= 8 else [])
    assert all(p.expected_requeues == 1 and p.expected_preemptions == 0 and p.long for p in crashed)


@pytest.mark.parametrize("jobs", [0, -3, MIN_JOBS - 1])
def test_too_few_jobs_is_one_line(jobs: int) -> None:
    with pytest.raises(UserError, match=rf"^--jobs {jobs}: a mixed workload needs at least {MIN_JOBS} jobs"):
        plan_workload(jobs, 1)


def test_too_few_jobs_exits_2_before_any_testbed(tmp_path: Path, run_main: RunMain) -> None:
    state = tmp_path / "tb"
    code, out, err = run_main(["fleet", "simulate", "--jobs", "0", "--state-dir", str(state)])
    assert (code, out) == (2, "") and len(err.strip().splitlines()) == 1 and "--jobs 0" in err
    assert not state.exists()
    code, _, err = run_main(["fleet", "simulate", "--jobs", "7", "--out", str(tmp_path / "no/such/t.json")])
    assert code == 2 and err.strip() == f"error: --out {tmp_path}/no/such/t.json: no directory {tmp_path}/no/such"


def test_a_plan_that_does_not_fit_the_testbed_is_refused() -> None:
    planned = plan_workload(40, 1)
    check_plan_fits(planned, 8)
    with pytest.raises(UserError, match="trainings need"):
        check_plan_fits(planned, 3)
    three = tuple(PlannedJob(f"t{i}", "training", "ops", "normal", "") for i in range(3))
    with pytest.raises(UserError, match="trainings of ops exceed its node quota of 2"):
        check_plan_fits(three, 8)


def test_a_runs_starts_end_with_the_batch_scripts_last_event_of_each() -> None:
    submissions = [
        {"time": 9.0, "kind": "submitted", "job_id": "7"},
        {"time": 10, "kind": "started", "job_id": "7", "restart_count": 0, "nodelist": "n1"},
        {"time": 40, "kind": "started", "job_id": "7", "restart_count": 1, "nodelist": "n2"},
    ]
    events = [
        {"time": 20.0, "kind": "step_ended", "job_id": "7", "restart_count": 0},
        {"time": 21.5, "kind": "preempted", "job_id": "7", "restart_count": 0},
        {"time": 30.0, "kind": "stop", "step": 3},
        {"time": 70.0, "kind": "step_ended", "job_id": "7", "restart_count": 1},
    ]
    assert training_starts(submissions, events) == [
        {"start_s": 10, "end_s": 21.5, "nodelist": "n1"},
        {"start_s": 40, "end_s": 70.0, "nodelist": "n2"},
    ]
    assert training_starts(submissions[:2], []) == [{"start_s": 10, "end_s": None, "nodelist": "n1"}]


def test_a_short_jobs_truth_comes_from_its_own_marks_and_says_when_it_differs(tmp_path: Path) -> None:
    (tmp_path / "failure-0-nobody.start").write_text("100.25\n")
    (tmp_path / "failure-0-nobody.end").write_text("101.5\n")
    planned = PlannedJob("failure-0-nobody", "failure", "ops", "normal", "nobody", expected_state="FAILED")
    job = Submitted(planned, job_id="12", submit_s=99.0, state="FAILED")
    truth = job_truth(job, {planned.name: job}, tmp_path)
    assert (truth["submit_s"], truth["start_s"], truth["end_s"]) == (99.0, 100.25, 101.5)
    assert truth["injected_failure"]["kind"] == "application" and truth["ok"] is True
    assert (truth["user"], truth["account"], truth["qos"]) == ("nobody", "ops", "normal")
    job.state = "COMPLETED"
    assert job_truth(job, {planned.name: job}, tmp_path)["ok"] is False
    assert read_mark(tmp_path / "missing") is None


def test_the_truth_file_is_written_whole(tmp_path: Path) -> None:
    out = tmp_path / "truth.json"
    write_truth({"ok": True, "jobs": []}, out)
    assert json.loads(out.read_text()) == {"ok": True, "jobs": []}
    assert [p.name for p in tmp_path.iterdir()] == ["truth.json"]
