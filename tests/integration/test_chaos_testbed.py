"""``air-hpc chaos`` on the real testbed: a preemption, a hung rank, a killed rank, a dead node; nothing lost.

The command runs the job twice at once (one copy untouched), signals the batch
shell of the other, then freezes one of its ranks so the watchdog stops the step
as hung; both restarts resume from checkpoints, and every logged loss and the
final weights must equal the untouched copy's bit for bit.
"""

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from air_hpc.health.badnodes import read_bad_nodes
from air_hpc.records.events import read_events
from air_hpc.records.jsonl import read_jsonl
from air_hpc.records.rundir import RunDir
from air_hpc.slurm import hostlist
from air_hpc.slurm.nodes import fetch_sinfo_states
from air_hpc.train import data
from tests.conftest import RunMain

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def overrides_for(tmp_path: Path, health_defaults: bool = False) -> list[str]:
    """The campaign's job: short, checkpointing often; ``health_defaults``: the shipped hang limits, else short
    ones (without a learned limit a frozen rank is then still noticed in seconds, in a step or in a save)."""
    corpus = tmp_path / "corpus.h5"
    data.prepare(data.project_sources(), corpus, data.ByteTokenizer())
    short_limits = [
        "health.heartbeat_step_s=15",
        "health.heartbeat_checkpoint_s=20",
        "checkpoint.async_wait_s=10",
    ]
    return [
        f"run.root={tmp_path / 'runs'}",
        f"data.path={corpus}",
        "train.steps=10",
        "checkpoint.interval_steps=3",
        "checkpoint.keep_last=10",
        "health.preflight=false",
        *([] if health_defaults else short_limits),
    ]


class Campaign:
    """One ``air-hpc chaos --json`` run; every check prints the campaign's whole answer when it fails."""

    def __init__(
        self,
        testbed: Any,
        tmp_path: Path,
        run_main: RunMain,
        faults: str,
        count: int,
        seed: int,
        overrides: Sequence[str] = (),
        defaults: bool = False,
    ) -> None:
        """``overrides`` follow the campaign's own; ``defaults``: the shipped health limits."""
        args = ["chaos", str(REPO / "configs/jobs/gpt-tiny-testbed.yaml"), "--faults", faults, "--count", str(count)]
        args += ["--seed", str(seed), "--state-dir", str(testbed.state_dir), "--json", "--timeout-s", "400"]
        sets = [*overrides_for(tmp_path, health_defaults=defaults), *overrides]
        self.code, out, self.err = run_main([*args, *(a for o in sets for a in ("--set", o))])
        self.result: dict[str, Any] = json.loads(out) if out.strip() else {}
        self.check("nothing_lost" in self.result)  # else the campaign could not go on: stderr says why

    def check(self, condition: bool) -> None:
        assert condition, f"exit {self.code}\n{json.dumps(self.result, indent=2)}\nstderr:\n{self.err[-3000:]}"

    def check_nothing_lost(self, kinds: list[str]) -> None:
        """The exit code is the verdict's; nothing lost; every fault of ``kinds`` struck (none was skipped)."""
        result = self.result
        self.check(self.code == result["exit_code"] == (0 if result["nothing_lost"] else 1))
        self.check(
            result["nothing_lost"] and result["final_state"] == "COMPLETED" and result["verdict"] == "nothing lost"
        )
        self.check(result["losses_equal"] and result["weights_equal"])
        self.check(
            sorted(f["kind"] for f in result["faults"]) == kinds and not any(f["skipped"] for f in result["faults"])
        )


def test_a_preemption_and_a_hang_lose_nothing(testbed: Any, tmp_path: Path, run_main: RunMain) -> None:
    campaign = Campaign(testbed, tmp_path, run_main, "preempt,hang", 2, seed=1)
    campaign.check_nothing_lost(["hang", "preempt"])
    result = campaign.result
    for fault in result["faults"]:
        campaign.check(fault["detected_after_s"] is not None and fault["resumed_after_s"] > fault["detected_after_s"])
        campaign.check(fault["resumed_from_step"] is not None)
    preempt = next(f for f in result["faults"] if f["kind"] == "preempt")
    campaign.check(preempt["steps_lost"] == 0)  # the preemption saved at the step it stopped at
    campaign.check(0 < result["goodput"] < result["reference_goodput"] <= 1)


def test_a_killed_rank_without_spares_resumes_from_its_checkpoint(
    testbed: Any, tmp_path: Path, run_main: RunMain
) -> None:
    """SIGKILL, no warning, no save: the crashed step is requeued and resumes from the newest checkpoint."""
    campaign = Campaign(testbed, tmp_path, run_main, "rank-kill", 1, seed=3)
    campaign.check_nothing_lost(["rank-kill"])
    (fault,) = campaign.result["faults"]
    campaign.check(fault["resumed_from_step"] is not None)
    requeues = [e for e in read_events(Path(campaign.result["run_dir"]) / "events.jsonl") if e["kind"] == "requeue"]
    campaign.check([e["reason"] for e in requeues] == ["crashed"])


def test_a_dead_node_without_spares_is_blamed_and_the_run_resumes_elsewhere(
    testbed: Any, tmp_path: Path, run_main: RunMain
) -> None:
    """Power loss on a node (its slurmd and every process it started): the supervisor's probe finds the dead
    node, ends srun, the node goes on the bad-node list, and the job, requeued by its batch script long before
    slurmctld times the node out, resumes on other nodes; the node comes back."""
    campaign = Campaign(testbed, tmp_path, run_main, "node-kill", 1, seed=3)
    campaign.check_nothing_lost(["node-kill"])
    run_dir = RunDir(Path(campaign.result["run_dir"]))
    (dead,) = read_bad_nodes(run_dir.bad_nodes)
    events = read_events(run_dir.events)
    campaign.check([e["nodes"] for e in events if e["kind"] == "node_dead"] == [[dead]])
    campaign.check([e["reason"] for e in events if e["kind"] == "requeue"] == ["requeue-worthy"])
    starts = [r["nodelist"] for r in read_jsonl(run_dir.submissions) if r.get("kind") == "started"]
    campaign.check(len(starts) == 2 and dead not in hostlist.expand(starts[1], "started"))
    campaign.check(fetch_sinfo_states(testbed.client)[dead].rstrip("*~#") in {"idle", "allocated", "mixed"})
