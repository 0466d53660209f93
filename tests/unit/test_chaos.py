"""The fault schedule, the bit-for-bit comparison, each fault's outcome and the campaign's verdict; bad input."""

import itertools
import json
import os
import random
import subprocess
from pathlib import Path

import click
import pytest

from air_hpc.chaos.campaign import Campaign, CampaignError, _strike, _Watch, run_campaign
from air_hpc.chaos.inject import Target, _beats_saving, check_cluster
from air_hpc.chaos.outcome import CampaignResult, Injection, fault_outcome, format_result, outcomes
from air_hpc.chaos.schedule import FAULT_KINDS, Fault, parse_kinds, plan
from air_hpc.cli.main import COMMANDS
from air_hpc.errors import UserError
from air_hpc.exitcodes import ExitCode
from air_hpc.health.heartbeat import Heartbeat
from air_hpc.observe.compare import Comparison, compare_runs, loss_mismatches
from air_hpc.observe.records import RunRecords, parse_events, parse_steps
from air_hpc.records.rundir import RunDir
from air_hpc.resilience.store import FileEntry, Manifest, step_name
from air_hpc.slurm.client import SlurmClient
from air_hpc.slurm.fake import FakeJob, FakeSlurm
from air_hpc.slurm.jobs import JobState
from air_hpc.train import data
from tests.conftest import RunMain
from tests.unit.test_cli import TESTBED_JOB

# ---- schedule ----------------------------------------------------------------


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    kinds = ("preempt", "rank-kill", "hang")
    assert plan(kinds, 5, seed=7, total_steps=12) == plan(kinds, 5, seed=7, total_steps=12)
    assert plan(kinds, 5, seed=7, total_steps=12) != plan(kinds, 5, seed=8, total_steps=12)


def test_every_kind_strikes_before_any_repeats_at_ascending_steps_inside_the_run() -> None:
    faults = plan(FAULT_KINDS, 8, seed=3, total_steps=12)
    assert [f.number for f in faults] == list(range(1, 9))
    assert set(f.kind for f in faults) == set(FAULT_KINDS)
    steps = [f.after_step for f in faults]
    assert steps == sorted(steps) and steps[0] >= 1 and steps[-1] <= 10
    assert all(0.0 <= f.delay_steps <= 1.0 for f in faults)
    assert plan(("preempt",), 0, seed=1, total_steps=12) == ()


@pytest.mark.parametrize("seed", range(20))
def test_a_fault_lands_with_a_whole_step_left_after_it(seed: int) -> None:
    """A fault follows its step by less than a step, so it lands inside the next one: never the last step when the
    run has more than two (a fault after step 9 of 10 strikes as the run ends on a fast machine)."""
    for total in (2, 3, 10):
        faults = plan(("preempt", "hang"), 4, seed=seed, total_steps=total)
        assert all(1 <= f.after_step <= max(1, total - 2) for f in faults)


def test_fault_kinds_are_parsed_once_each() -> None:
    assert parse_kinds(" preempt,hang,preempt ") == ("preempt", "hang")


@pytest.mark.parametrize("text", ["preempt,meteor", "", ","])
def test_an_unknown_fault_kind_is_a_user_error(text: str) -> None:
    with pytest.raises(UserError, match=r"--faults .*expected a comma-separated list of preempt"):
        parse_kinds(text)


def test_a_negative_count_or_a_one_step_run_is_a_user_error() -> None:
    with pytest.raises(UserError, match="--count -1: expected 0 or more"):
        plan(("preempt",), -1, seed=1, total_steps=10)
    with pytest.raises(UserError, match=r"train\.steps 1"):
        plan(("preempt",), 1, seed=1, total_steps=1)


def test_slurm_preempt_needs_the_urgent_partition() -> None:
    class Sinfo(SlurmClient):
        def __init__(self, text: str) -> None:
            super().__init__(env={})
            self.text = text

        def run(self, args: object, **_: object) -> subprocess.CompletedProcess[str]:
            return subprocess.CompletedProcess([], 0, self.text, "")

    with pytest.raises(UserError, match="no 'urgent' partition; it has debug"):
        check_cluster(("slurm-preempt",), Sinfo("debug|8|2|1000|(null)\n"))
    check_cluster(("slurm-preempt",), Sinfo("debug|8|2|1000|(null)\nurgent|8|2|1000|(null)\n"))
    check_cluster(("preempt",), Sinfo(""))


# ---- comparison --------------------------------------------------------------


def test_every_logged_loss_must_equal_the_reference_bit_for_bit() -> None:
    reference = [(1, 5.0), (2, 4.5), (3, 4.25)]
    retrained = [(1, 5.0), (2, 4.5), (2, 4.5), (3, 4.25)]  # step 2 trained again after a restart
    assert loss_mismatches(retrained, reference) == ()
    assert loss_mismatches([(1, 5.0), (2, 4.500000000000001)], reference) == (
        "step 2: 4.500000000000001 != 4.5 (reference)",
        "step 3: not logged",
    )
    assert loss_mismatches([*reference, (4, 1.0)], reference) == ("step 4: not in the reference",)


def _run(root: Path, name: str, losses: list[tuple[int, float]], shards: dict[str, str] | None) -> RunDir:
    run_dir = RunDir(root / name)
    run_dir.path.mkdir(parents=True)
    run_dir.metrics.write_text("".join(json.dumps({"step": s, "loss": v}) + "\n" for s, v in losses))
    if shards is not None:
        directory = run_dir.checkpoints / step_name(3)
        directory.mkdir(parents=True)
        files = tuple(FileEntry(p, 10, h) for p, h in {**shards, "common.pt": "x"}.items())
        (directory / "manifest.json").write_text(Manifest(step=3, files=files, created_s=1.0).to_json())
    return run_dir


def test_compare_runs_checks_losses_and_the_final_shards(tmp_path: Path) -> None:
    losses = [(1, 5.0), (2, 4.5), (3, 4.25)]
    shards = {"__0_0.distcp": "aa", "__1_0.distcp": "bb"}
    reference = _run(tmp_path, "reference", losses, shards)
    assert compare_runs(_run(tmp_path, "same", losses, shards), reference, 3).identical
    other = compare_runs(_run(tmp_path, "other", losses, {**shards, "__1_0.distcp": "cc"}), reference, 3)
    assert (
        other.losses_equal and not other.weights_equal and "1 shard(s) differ, e.g. __1_0.distcp" in other.weights_note
    )
    missing = compare_runs(_run(tmp_path, "unsaved", losses[:2], None), reference, 3)
    assert not missing.losses_equal and not missing.weights_equal and "no manifest" in missing.weights_note


# ---- outcomes and verdict ------------------------------------------------------


def _records(steps: list[tuple[int, float]], events: list[dict[str, object]]) -> RunRecords:
    rows = [{"step": s, "loss": 1.0, "step_time_s": 1.0, "time": t} for s, t in steps]
    return RunRecords(
        steps=parse_steps(rows), events=parse_events(events), starts_s=(), total_steps=10, tokens_per_step=1
    )


def _injection(number: int, kind: str, at: float, skipped: str = "", step: int = 0) -> Injection:
    return Injection(Fault(number, kind, 1, 0.0), at, "" if skipped else "rank 1 pid 9 on n2", step, skipped)


def test_a_killed_rank_is_detected_resumed_and_its_steps_since_the_checkpoint_counted_lost() -> None:
    records = _records(
        [(1, 101.0), (2, 102.0), (3, 103.0), (4, 104.0), (4, 131.0), (5, 132.0)],
        [
            {"time": 103.5, "kind": "checkpoint_saved", "step": 3},
            {"time": 104.9, "kind": "requeue", "exit_code": 86},
            {"time": 129.0, "kind": "start", "generation": "7-1"},
            {"time": 130.0, "kind": "resume", "step": 3},
        ],
    )
    outcome = fault_outcome(records, _injection(1, "rank-kill", 104.5), float("inf"))
    assert (outcome.detected_after_s, outcome.resumed_after_s) == (pytest.approx(0.4), pytest.approx(26.5))
    assert (outcome.resumed_from_step, outcome.steps_lost) == (3, 1)
    # Step 5 would have ended at 105.0; it ended at 132.0: 26 s down (104.0 to the restart's first step at 130.0)
    # and step 4 trained again.
    assert outcome.seconds_lost == pytest.approx(27.0) and outcome.detected_by == "requeue"


def test_a_killed_rank_whose_peers_recorded_nothing_is_detected_by_the_in_job_restart() -> None:
    """The ranks beside a killed one may be ended before they record their own failure: the supervisor's
    in-job restart is the detection then."""
    records = _records(
        [(1, 101.0), (2, 102.0), (3, 104.0)],
        [
            {"time": 102.6, "kind": "step_ended", "exit_code": 137},
            {"time": 102.61, "kind": "in_job_restart", "attempt": 1, "replaced": {}},
            {"time": 102.62, "kind": "start", "generation": "7-0.1"},
            {"time": 103.5, "kind": "memory_resume", "step": 2},
        ],
    )
    outcome = fault_outcome(records, _injection(1, "rank-kill", 102.5), float("inf"))
    assert outcome.detected_after_s == pytest.approx(0.11) and outcome.detected_by == "in_job_restart"
    assert (outcome.resumed_from_step, outcome.steps_lost) == (2, 0)


def test_a_resume_from_in_memory_snapshots_counts_from_the_snapshots_step() -> None:
    records = _records(
        [(1, 101.0), (2, 102.0), (3, 103.0), (4, 104.0), (5, 109.0)],
        [
            {"time": 103.5, "kind": "checkpoint_saved", "step": 3},
            {"time": 104.9, "kind": "in_job_restart", "attempt": 1, "replaced": {}, "reason": "x", "spares_left": []},
            {"time": 107.0, "kind": "start", "generation": "7-0.1"},
            {"time": 108.0, "kind": "memory_resume", "step": 4, "seconds": 0.1, "sources": {}, "newest_checkpoint": 3},
        ],
    )
    outcome = fault_outcome(records, _injection(1, "rank-kill", 104.5), float("inf"))
    assert (outcome.resumed_from_step, outcome.steps_lost) == (4, 0)


def test_a_resume_a_later_fault_trained_again_still_counts_as_recovered() -> None:
    """Fault 1's restart trained steps 4-5, fault 2 struck and its resume dropped their metrics: the startup
    event (never rewritten) still shows fault 1 recovered (the campaign said 'not recovered', 'LOST')."""
    records = _records(
        [(1, 101.0), (2, 102.0), (3, 103.0), (4, 161.0), (5, 162.0)],
        [
            {"time": 103.5, "kind": "checkpoint_saved", "step": 3},
            {"time": 104.9, "kind": "requeue", "exit_code": 137},
            {"time": 129.0, "kind": "start", "generation": "7-1"},
            {"time": 130.0, "kind": "resume", "step": 3},
            {"time": 131.0, "kind": "startup", "step": 4},
            {"time": 140.0, "kind": "requeue", "exit_code": 86},
            {"time": 158.0, "kind": "start", "generation": "7-2"},
            {"time": 159.0, "kind": "resume", "step": 3},
            {"time": 161.0, "kind": "startup", "step": 4},
        ],
    )
    first, second = outcomes(records, [_injection(1, "rank-kill", 104.5), _injection(2, "hang", 134.0)])
    assert first.resumed_after_s == pytest.approx(26.5) and first.resumed_from_step == 3
    assert second.resumed_after_s == pytest.approx(27.0) and second.resumed_from_step == 3


def test_a_restart_without_a_usable_checkpoint_lost_every_step_reached() -> None:
    """The restarted run dropped the metrics it trained again: the step reached when the fault struck counts."""
    records = _records(
        [(1, 181.0), (2, 182.0)],
        [{"time": 126.0, "kind": "hang", "step": 4}, {"time": 176.0, "kind": "start"}],
    )
    outcome = fault_outcome(records, _injection(1, "hang", 104.0, step=3), float("inf"))
    assert (outcome.detected_after_s, outcome.resumed_after_s) == (pytest.approx(22.0), pytest.approx(77.0))
    assert (outcome.resumed_from_step, outcome.steps_lost) == (0, 3)


def test_a_straggler_needs_no_restart_and_a_skipped_fault_is_not_lost() -> None:
    records = _records([(1, 101.0), (2, 102.0), (3, 109.0)], [])
    first, second = outcomes(records, [_injection(1, "straggler", 102.5), _injection(2, "ckpt-kill", 110.0, "gone")])
    assert (first.resumed_after_s, first.resumed_from_step, first.steps_lost) == (pytest.approx(6.5), None, 0)
    assert first.detected_after_s is None and not first.lost
    assert second.resumed_after_s is None and second.skipped == "gone" and not second.lost
    assert second.seconds_lost == 0.0


def test_a_straggler_loses_the_time_its_steps_took_beyond_the_typical_step() -> None:
    rows = [{"step": s, "loss": 1.0, "step_time_s": t, "time": 100.0 + s * 2} for s, t in [(1, 1), (2, 1), (3, 1)]]
    rows += [{"step": 4, "loss": 1.0, "step_time_s": 4.5, "time": 112.0}, {"step": 5, "loss": 1.0, "step_time_s": 2.0}]
    records = RunRecords(parse_steps(rows), (), (), total_steps=10, tokens_per_step=1)
    (fault,) = outcomes(records, [_injection(1, "straggler", 106.5, step=3)])
    assert fault.seconds_lost == pytest.approx(3.5)  # step 4 took 4.5 s where 1 s is typical


def test_a_preemption_that_saved_its_step_loses_only_the_downtime() -> None:
    (fault,) = outcomes(PREEMPTED, [_injection(1, "preempt", 101.5)])
    assert (fault.steps_lost, fault.resumed_from_step, fault.detected_by) == (0, 1, "signal")
    assert fault.seconds_lost == pytest.approx(38.0)  # step 2 would have ended at 102.0, it ended at 140.0


def test_a_fault_never_recovered_from_has_no_seconds_lost_and_a_hang_names_its_limit() -> None:
    limit = "save limit 30 s, learned: max(floor 30 s, 5 x p99 0.2 s of 7 save samples), under the configured 900 s"
    records = _records(TEN_STEPS[:5], [{"time": 140.0, "kind": "hang", "step": 6, "phase": "save", "limit": limit}])
    (fault,) = outcomes(records, [_injection(1, "ckpt-hang", 105.5, step=5)])
    assert fault.lost and fault.seconds_lost is None
    assert fault.detected_after_s == pytest.approx(34.5) and fault.detected_by == f"hang: {limit}"
    text = format_result(_result((fault,)))
    assert f"   detected by hang: {limit}" in text


def test_the_campaign_totals_its_losses_beside_the_reference() -> None:
    first = fault_outcome(PREEMPTED, _injection(1, "preempt", 101.5), float("inf"))
    second = outcomes(RESUMED_AT_THE_LAST_STEP, [_injection(2, "preempt", 109.5, step=9)])[0]
    result = CampaignResult(2, (first, second), "COMPLETED", SAME, 0.5, 0.8, wall_s=100.0, reference_wall_s=60.0)
    assert first.seconds_lost is not None and second.seconds_lost is not None
    assert result.steps_lost == 0 and result.seconds_lost == pytest.approx(first.seconds_lost + second.seconds_lost)
    data = result.to_json()
    assert (data["steps_lost"], data["wall_s"], data["reference_wall_s"], data["extra_wall_s"]) == (0, 100, 60, 40)
    faults = data["faults"]
    assert isinstance(faults, list) and [f["seconds_lost"] for f in faults] == [first.seconds_lost, second.seconds_lost]
    text = format_result(result)
    assert f"lost         0 step(s), {result.seconds_lost:.1f}s in 2 fault(s); the run took 40.0s longer" in text
    assert format_result(_result(())).count("the run took") == 0


SAME = Comparison(True, True, (), "")
PREEMPTED = _records(
    [(1, 101.0), (2, 140.0)],
    [{"time": 102.0, "kind": "signal"}, {"time": 138.0, "kind": "start"}, {"time": 139.0, "kind": "resume", "step": 1}],
)
TEN_STEPS = [(s, 100.0 + s) for s in range(1, 11)]
#: The preemption landed in the last step: stop at step 10, requeue, the restart resumed at 10 with nothing to train.
RESUMED_AT_THE_LAST_STEP = _records(
    TEN_STEPS,
    [
        {"time": 110.1, "kind": "stop", "step": 10},
        {"time": 110.5, "kind": "requeue", "exit_code": 85},
        {"time": 130.0, "kind": "start"},
        {"time": 131.0, "kind": "resume", "step": 10},
    ],
)


def _result(faults: tuple, state: str = "COMPLETED", comparison: Comparison = SAME) -> CampaignResult:
    return CampaignResult(1, faults, state, comparison, 0.5, 0.8)


@pytest.mark.parametrize(
    ("result", "nothing_lost", "verdict"),
    [
        pytest.param(
            _result(outcomes(PREEMPTED, [_injection(1, "preempt", 101.5)])), True, "nothing lost", id="recovered"
        ),
        pytest.param(
            _result(
                outcomes(PREEMPTED, [_injection(1, "preempt", 101.5)]), comparison=Comparison(False, True, ("x",), "")
            ),
            False,
            "LOST: losses differ from the reference",
            id="lost-losses",
        ),
        pytest.param(
            _result(outcomes(PREEMPTED, [_injection(1, "hang", 139.5)])),
            False,
            "LOST: fault 1 (hang) not recovered from",
            id="lost-no-resume",
        ),
        pytest.param(
            _result(outcomes(PREEMPTED, [_injection(1, "hang", 139.5, skipped="the job had ended (COMPLETED)")])),
            True,
            "nothing lost (1 of 1 fault(s) skipped, see above)",
            id="not-injected",
        ),
        pytest.param(
            _result(outcomes(RESUMED_AT_THE_LAST_STEP, [_injection(1, "preempt", 109.5, step=9)])),
            True,
            "nothing lost",
            id="landed-in-the-last-step",
        ),
        pytest.param(
            _result(outcomes(_records(TEN_STEPS, []), [_injection(1, "preempt", 110.2, step=10)])),
            True,
            "nothing lost (1 of 1 fault(s) skipped, see above)",
            id="after-the-last-step",
        ),
        pytest.param(
            _result(outcomes(PREEMPTED, [_injection(1, "preempt", 101.5)]), state="FAILED"),
            False,
            "LOST: final state FAILED",
            id="run-failed",
        ),
        pytest.param(_result(()), False, "LOST: 1 scheduled fault(s) without an outcome", id="no-outcome"),
    ],
)
def test_the_verdict_and_the_exit_code_say_the_same_thing(
    result: CampaignResult, nothing_lost: bool, verdict: str
) -> None:
    """The exit code is the verdict's, in every outcome (issue 28: a lost campaign exited 0)."""
    assert result.nothing_lost is nothing_lost and result.verdict == verdict
    assert result.exit_code == (ExitCode.OK if nothing_lost else ExitCode.FAILURE)
    data = result.to_json()
    assert (data["nothing_lost"], data["verdict"], data["exit_code"]) == (nothing_lost, verdict, int(result.exit_code))
    assert f"verdict      {verdict}" in format_result(result)


def test_a_fault_in_the_last_step_recovered_when_the_restart_resumed_there() -> None:
    (fault,) = outcomes(RESUMED_AT_THE_LAST_STEP, [_injection(1, "preempt", 109.5, step=9)])
    assert (fault.detected_after_s, fault.resumed_after_s) == (pytest.approx(0.6), pytest.approx(21.5))
    assert (fault.resumed_from_step, fault.steps_lost, fault.skipped) == (10, 0, "")


def test_a_fault_the_run_went_on_training_through_is_lost_not_skipped() -> None:
    """No restart after a preemption, yet steps went on: the signal was ignored, a bug the campaign must report."""
    (fault,) = outcomes(_records(TEN_STEPS, []), [_injection(1, "preempt", 105.5, step=5)])
    assert fault.lost and not fault.skipped


def test_the_report_names_each_skipped_fault_and_the_losses() -> None:
    skipped = _injection(2, "hang", 150.0, skipped="the run had trained its last step (2 of 2) before it could strike")
    faults = outcomes(PREEMPTED, [_injection(1, "preempt", 101.5), skipped])
    text = format_result(
        CampaignResult(2, faults, "COMPLETED", Comparison(False, True, ("step 2: not logged",), ""), 0.5, 0.8)
    )
    assert " 1 preempt" in text and " 2 hang          skipped: the run had trained its last step (2 of 2)" in text
    assert "losses       DIFFER\n  step 2: not logged" in text
    assert "goodput      50.0% (reference 80.0%, -30.0 points)" in text and "verdict      LOST: losses differ" in text


@click.command()
def verdict_probe() -> None:
    click.get_current_context().exit(ExitCode.FAILURE)


def test_a_verdict_s_exit_code_leaves_main_in_every_entry_point(
    run_main: RunMain, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ctx.exit(1)`` inside a command came back from click as a return value: ``python -m air_hpc`` and the tests'
    run_main exited 0 where the ``air-hpc`` script exited 1 (the chaos test passed ``code == 0`` on a lost run)."""
    monkeypatch.setitem(COMMANDS, "verdict-probe", f"{__name__}:verdict_probe")
    code, _, _ = run_main(["verdict-probe"])
    assert code == ExitCode.FAILURE


# ---- the command's bad input -----------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--faults", "preempt,meteor", "--count", "2"], "unknown fault kind(s) 'meteor'"),
        (["--faults", "preempt", "--count", "-1"], "--count -1: expected 0 or more faults"),
    ],
)
def test_chaos_bad_input_is_one_line_and_exit_2(
    args: list[str], message: str, run_main: RunMain, tmp_path: Path
) -> None:
    code, out, err = run_main(["chaos", TESTBED_JOB, *args, "--state-dir", str(tmp_path / "tb")])
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and out == ""
    assert not (tmp_path / "tb").exists()  # refused before the testbed starts


def test_chaos_refuses_a_job_for_another_cluster(run_main: RunMain, tmp_path: Path) -> None:
    (tmp_path / "clusters").mkdir()
    (tmp_path / "clusters" / "prod.yaml").write_text("partition: batch\n")
    (tmp_path / "jobs").mkdir()
    job = tmp_path / "jobs" / "job.yaml"
    job.write_text(Path(TESTBED_JOB).read_text().replace("cluster: testbed", "cluster: prod"))
    code, _, err = run_main(["chaos", str(job), "--faults", "preempt", "--count", "1"])
    assert code == 2 and "air-hpc chaos runs only on the local testbed" in err and len(err.strip().splitlines()) == 1


# ---- campaign ------------------------------------------------------------------


def test_a_campaign_that_cannot_go_on_cancels_both_copies(tmp_path: Path) -> None:
    """A stalled run (here: never started) ends the campaign with one line, and leaves no job holding nodes."""
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 50)
    corpus = data.prepare([text], tmp_path / "corpus.h5", data.ByteTokenizer()).path
    topology = tmp_path / "topology.conf"
    topology.write_text("SwitchName=a Nodes=n[1-2]\nSwitchName=b Nodes=n[3-4]\nSwitchName=top Switches=a,b\n")
    fake = FakeSlurm(nodes={f"n{i}": "IDLE" for i in range(1, 5)})
    overrides = (f"run.root={tmp_path / 'runs'}", f"data.path={corpus}")
    campaign = Campaign(Path(TESTBED_JOB), overrides, ("hang",), 1, 1, topology, timeout_s=0.3, poll_s=0.05)
    with pytest.raises(CampaignError, match=r"did not happen in 0\.3 s"):
        run_campaign(campaign, fake)
    assert len(fake.jobs) == 2
    assert all(job.state == JobState.CANCELLED for job in fake.jobs.values())


def _target(tmp_path: Path, steps: int, state: JobState = JobState.RUNNING) -> tuple[FakeSlurm, Target]:
    """A running job on the fake cluster whose run has logged ``steps`` steps."""
    fake = FakeSlurm()
    fake.jobs["7"] = FakeJob("7", "chaos", 2, "", state=state, nodelist="n[1-2]")
    run_dir = RunDir(tmp_path / "run")
    run_dir.path.mkdir()
    rows = [{"step": s, "loss": 1.0, "step_time_s": 0.1, "time": 100.0 + s} for s in range(1, steps + 1)]
    run_dir.metrics.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return fake, Target("7", run_dir, fake, "USR2", 2, random.Random(1))


def _strike_one(tmp_path: Path, steps: int, state: JobState = JobState.RUNNING) -> tuple[FakeSlurm, Injection]:
    fake, target = _target(tmp_path, steps, state)
    campaign = Campaign(Path(TESTBED_JOB), (), ("preempt",), 1, 1, tmp_path, timeout_s=5.0, poll_s=0.01)
    seen: list[Injection] = []
    (injection,) = _strike(
        campaign, plan(("preempt",), 1, seed=1, total_steps=10), _Watch(target, campaign, 10), seen.append
    )
    assert seen == [injection]  # announced as it happened
    return fake, injection


def test_a_fault_strikes_at_its_step_while_training_is_left(tmp_path: Path) -> None:
    fake, injection = _strike_one(tmp_path, steps=9)
    assert fake.jobs["7"].signals == ["USR2"] and not injection.skipped and injection.step == 9


def test_a_fault_is_never_injected_after_the_run_trained_its_last_step(tmp_path: Path) -> None:
    """Issue 28: the run got to step 10 of 10 before the fault's moment (a fast machine); the preemption then only
    restarted a finished run. It is skipped, with the reason, and sent nowhere."""
    fake, injection = _strike_one(tmp_path, steps=10)
    assert fake.jobs["7"].signals == []
    assert injection.skipped == "the run had trained its last step (10 of 10) before it could strike"


def test_a_fault_is_skipped_when_the_job_ended_first(tmp_path: Path) -> None:
    fake, injection = _strike_one(tmp_path, steps=4, state=JobState.FAILED)
    assert fake.jobs["7"].signals == [] and injection.skipped == "the job had ended (FAILED) before it could strike"


def test_a_save_is_seen_in_the_running_step_whatever_directory_changed_last(tmp_path: Path) -> None:
    """After in-job restarts the heartbeat root holds the start's directory and every attempt's: the running step
    is the one whose beat was written last, even when another directory was touched after it (the start's
    records, a warm standby's), which hid every later save from ckpt-hang."""
    run = RunDir(tmp_path)
    earlier, later = itertools.count(100.0), itertools.count(200.0)
    old = Heartbeat(run.heartbeat / "7-0.1", rank=0, host="n1", clock=lambda: next(earlier))
    old.beat("save", 3)  # a save of the earlier attempt, long over
    running = Heartbeat(run.heartbeat / "7-0.2", rank=1, host="n2", clock=lambda: next(later))
    running.beat("save", 12)
    (run.heartbeat / "7-0" / "holders").mkdir(parents=True)
    for name, touched in (("7-0.1", 1.0e9), ("7-0.2", 1.1e9), ("7-0", 1.2e9)):  # 7-0 touched after the beats
        os.utime(run.heartbeat / name, (touched, touched))
    assert _beats_saving(run) == {1: (running.last.pid, 12)}
    running.beat("step", 13)
    assert _beats_saving(run) == {}
