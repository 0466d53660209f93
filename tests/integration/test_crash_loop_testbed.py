"""A run whose every start fails without saving stops with CRASH_LOOP instead of requeueing until the budget ends.

The real rendered batch script and the real trainer on the testbed: on every start a rank crashes in its
first training step (injected through ``sitecustomize``), before any checkpoint, so each start ends
crashed and is requeued. After ``resilience.max_no_progress_restarts`` such restarts the next start stops
at once with the dedicated exit code, which the batch script never requeues, well inside
``resilience.max_restarts``. (The test used to rely on the watchdog's 1 s setup limit being shorter than
building the model; since starts got faster the first start sometimes trained and saved before it.)
"""

from pathlib import Path
from typing import Any

import pytest

from air_hpc.config import load_job
from air_hpc.exitcodes import ExitCode
from air_hpc.launch.submit import submit
from air_hpc.observe.records import load_records
from air_hpc.observe.report import build_report, format_report
from air_hpc.ops.control import run_status
from air_hpc.records.events import read_events
from air_hpc.records.jsonl import read_jsonl
from air_hpc.records.rundir import RunDir
from air_hpc.slurm.jobs import JobState
from air_hpc.train import data
from tests.integration.step_injection import step_injection
from tests.integration.waiting import wait_ended

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

#: Injected through PYTHONPATH into every rank: rank 1 dies in whichever training step it reaches first.
CRASH_STEP = """
def step(self, consumed):
    os._exit(1)
"""


def test_restarts_without_progress_stop_with_crash_loop(testbed: Any, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.h5"
    data.prepare(data.project_sources(), corpus, data.ByteTokenizer())
    job = load_job(
        REPO / "configs/jobs/gpt-tiny-testbed.yaml",
        [
            f"run.root={tmp_path}",
            "run.name=crash-loop",
            f"data.path={corpus}",
            "placement.topology_aware=false",
            "health.preflight=false",
            "checkpoint.interval_steps=30",
            step_injection(tmp_path / "inject", CRASH_STEP, when='os.environ.get("SLURM_PROCID") == "1"'),
            "resilience.max_restarts=6",
            "resilience.max_no_progress_restarts=2",
        ],
    )
    done = submit(job, "slurm", testbed.client)
    run_dir = RunDir(done.run_dir)
    status = wait_ended(testbed.client, done.job_id, timeout_s=400)
    logs = "\n".join(p.read_text()[-1500:] for p in sorted(run_dir.logs.glob("slurm-*")))
    assert status.state == JobState.FAILED and status.exit_code == ExitCode.CRASH_LOOP, logs
    starts = [r["restart_count"] for r in read_jsonl(run_dir.submissions) if r.get("kind") == "started"]
    assert starts == [0, 1, 2], "two restarts without progress, then the stop; never requeued after it"
    events = read_events(run_dir.events)
    assert [e["kind"] for e in events if e["kind"] in ("start", "checkpoint_saved", "crash_loop")] == [
        "start",
        "start",
        "crash_loop",
    ]
    assert "not requeueing" in logs
    why = run_status(run_dir, testbed.client).stopped_because
    assert why is not None and why.startswith("crash loop: 2 restarts in a row made no progress")
    report = build_report(load_records(run_dir))
    assert report is not None and f"stopped      {why}" in format_report(report)
