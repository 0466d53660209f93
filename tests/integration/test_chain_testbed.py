"""A run longer than its time limit, as a chain of three singleton links on the real testbed.

Each step is slowed to 3 s (sitecustomize on the job's PYTHONPATH), so with a three-minute time limit and
``resilience.time_margin_s=90`` a link trains at most thirty steps (about twenty-five: the start takes a few
seconds of its 90), stops at the trainer's deadline, saves and hands over without requeueing itself; the
next link (``--dependency=singleton``) takes the run's ownership as it starts and resumes. The run reaches
its full step count, and the links left when it completes are cancelled before they ever get an allocation.

Slurm sends ``--signal`` up to a minute before the lead it was given (slurmctld checks time limits
periodically), so the deadline (limit - 90 s) is kept well ahead of the earliest signal
(limit - 10 s - 60 s): otherwise the link stops on the signal instead, as CI saw with a 2-minute limit.
"""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from air_hpc.records.events import read_events
from air_hpc.records.jsonl import read_jsonl
from air_hpc.records.metrics import read_metrics
from air_hpc.records.rundir import RunDir
from air_hpc.train import data
from tests.integration.step_injection import slow_steps_override
from tests.integration.waiting import wait_ended

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
STEPS = 34  # more than a link can train: the second one trains the last few


def test_a_three_link_chain_reaches_the_full_step_count_under_a_short_time_limit(testbed: Any, tmp_path: Path) -> None:
    corpus = data.prepare(data.project_sources(), tmp_path / "corpus.h5", data.ByteTokenizer()).path
    sets = [
        f"run.root={tmp_path / 'runs'}",
        "run.name=chained",
        f"data.path={corpus}",
        f"cluster.topology_file={testbed.topology_conf}",
        f"train.steps={STEPS}",
        "checkpoint.interval_steps=10",
        "health.preflight=false",
        "resources.nodes=1",
        "resources.tasks_per_node=2",
        "parallel.tp=2",
        "parallel.pp=1",
        "resources.time_limit_min=3",
        "resilience.time_margin_s=90",
        "resilience.signal_lead_s=10",
        slow_steps_override(tmp_path / "inject", 3.0),
    ]
    args = ["submit", "configs/jobs/gpt-tiny-testbed.yaml", *(f"--set={s}" for s in sets), "--chain", "3", "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "air_hpc", *args],
        env={**os.environ, **testbed.env},
        cwd=REPO,
        text=True,
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    links = json.loads(done.stdout)["chain"]
    assert len(links) == 3
    run = RunDir(tmp_path / "runs" / "chained")
    for job_id in links:
        wait_ended(testbed.client, job_id, timeout_s=900)

    assert max(int(r["step"]) for r in read_metrics(run.metrics)) == STEPS
    started = [r["job_id"] for r in read_jsonl(run.submissions) if r.get("kind") == "started"]
    assert len(started) >= 2 and started == sorted(started, key=links.index)  # each link once, in order
    assert len(set(started)) == len(started)  # no link requeued itself
    events = read_events(run.events)
    stops = [e for e in events if e["kind"] == "stop"]
    resumes = [e for e in events if e["kind"] == "resume"]
    assert [e["reason"] for e in stops] == ["deadline"] * (len(started) - 1)
    assert [e["step"] for e in resumes] == [e["step"] for e in stops]  # each link resumed where the last stopped
    states = {job_id: str(testbed.client.job_status(job_id).state) for job_id in links}
    assert all(states[j] == "CANCELLED" for j in links if j not in started), states
    logs = "\n".join(p.read_text() for p in run.logs.glob("*.err"))
    assert "resumes the run" in logs  # a link handed over at its deadline instead of requeueing itself
