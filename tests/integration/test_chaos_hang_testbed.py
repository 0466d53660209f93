"""A rank frozen inside a save, on the real testbed, with the default health limits (a 900 s save cap).

The run learned its step and save times first (sub-second here), so the other ranks' watchdogs
fire at a learned limit far under the configured one; the hang event says which limit fired and
how it was derived; the run resumes and ends bit for bit equal to an untouched copy.
"""

from pathlib import Path
from typing import Any

import pytest

from air_hpc.config.models import HealthConfig
from air_hpc.health.limits import LIMITED_PHASES
from air_hpc.records.events import read_events
from air_hpc.records.phase_times import read_phase_times
from air_hpc.records.rundir import RunDir
from tests.conftest import RunMain
from tests.integration.test_chaos_testbed import Campaign

pytestmark = pytest.mark.integration


def test_a_rank_frozen_in_a_save_is_caught_at_a_learned_limit(testbed: Any, tmp_path: Path, run_main: RunMain) -> None:
    # seed 9: the fault follows step 30 of 40 and strikes the save of step 32: by then the run has seen
    # 25 steps past each start's warm-up and 7 saves, enough to learn both limits.
    campaign = Campaign(
        testbed,
        tmp_path,
        run_main,
        "ckpt-hang",
        1,
        seed=9,
        overrides=["train.steps=40", "checkpoint.interval_steps=4", "checkpoint.keep_last=20"],
        defaults=True,
    )
    campaign.check_nothing_lost(["ckpt-hang"])
    (fault,) = campaign.result["faults"]
    campaign.check("during the save of step" in fault["target"])
    run_dir = RunDir(Path(campaign.result["run_dir"]))
    (hang,) = [e for e in read_events(run_dir.events) if e["kind"] == "hang"]
    cap = HealthConfig().heartbeat_checkpoint_s if hang["phase"] != "step" else HealthConfig().heartbeat_step_s
    campaign.check(hang["phase"] in {"save", "step"})
    campaign.check(hang["limit_s"] <= 2 * HealthConfig().learned_limit_floor_s < cap)
    campaign.check(f"{hang['phase']} limit " in hang["limit"] and ", learned: max(floor 30 s, 5 x p99" in hang["limit"])
    campaign.check(hang["silent_s"] >= hang["limit_s"])  # never before its limit
    times = read_phase_times(run_dir.phase_times, LIMITED_PHASES)
    campaign.check(len(times["step"]) >= 20 and len(times["save"]) >= 3 and len(times["setup"]) >= 1)
