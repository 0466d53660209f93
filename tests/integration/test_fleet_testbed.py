"""``air-hpc fleet report`` on the real testbed: its numbers against what sacct says and what our runs recorded.

One of our jobs (the batch template with a payload) is preempted by an urgent job and restarts; beside it run
jobs that are not ours (one completes, one fails). The expectations are read here from sacct with the csv
module and from the run's own ``preempted`` events, not from the report's code.
"""

import csv
import datetime
import json
import time
from pathlib import Path
from typing import Any

import pytest

from air_hpc.records.jsonl import read_jsonl
from air_hpc.records.rundir import RunDir
from air_hpc.slurm.jobs import JobState
from tests.integration.test_jobs_testbed import cli, payload, submit_payload, wait_ready, wait_state

pytestmark = pytest.mark.integration
__all__ = ["payload"]  # the fixture, used by name

FIELDS = ("JobIDRaw", "Account", "State", "Submit", "Start", "End", "NNodes")


def epoch(text: str) -> float | None:
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def sacct_says(testbed: Any, since_s: float, until_s: float) -> list[dict[str, str]]:
    """Every allocation record of the window, as sacct prints it."""
    fmt = "%Y-%m-%dT%H:%M:%S"
    out = testbed.client.run(
        [
            "sacct",
            "-a",
            "-X",
            "-P",
            "-n",
            "--duplicates",
            f"-S{time.strftime(fmt, time.localtime(since_s))}",
            f"-E{time.strftime(fmt, time.localtime(until_s))}",
            f"--format={','.join(FIELDS)}",
        ]
    ).stdout
    return [dict(zip(FIELDS, row, strict=True)) for row in csv.reader(out.splitlines(), delimiter="|")]


def node_seconds(rows: list[dict[str, str]], since_s: float, until_s: float) -> dict[str, float]:
    """Per account: nodes x the part of Start..End inside the window (sreport's clipping)."""
    used: dict[str, float] = {}
    for row in rows:
        start, end = epoch(row["Start"]), epoch(row["End"])
        if start is not None and end is not None:
            held = max(min(end, until_s) - max(start, since_s), 0.0)
            used[row["Account"]] = used.get(row["Account"], 0.0) + held * int(row["NNodes"])
    return used


def first_waits(rows: list[dict[str, str]], since_s: float, until_s: float) -> list[float]:
    """Submit to Start of each job's first record, for jobs that first started in the window."""
    first: dict[str, dict[str, str]] = {}
    for row in rows:
        if row["JobIDRaw"] not in first or row["Submit"] < first[row["JobIDRaw"]]["Submit"]:
            first[row["JobIDRaw"]] = row
    waits = []
    for row in first.values():
        start, submit = epoch(row["Start"]), epoch(row["Submit"])
        if start is not None and submit is not None and since_s <= start < until_s:
            waits.append(start - submit)
    return sorted(waits)


def test_report_equals_sacct_and_the_runs_own_preemptions(testbed: Any, tmp_path: Path, payload: Path) -> None:
    since_s = time.time() - 1
    runs = tmp_path / "runs"
    ours = submit_payload(testbed, runs, payload, "requeue", "fleet-preempted")
    wait_ready(ours.run_dir, 4)
    nodes = (testbed.client.show_job(ours.job_id) or {})["NodeList"]
    urgent = testbed.client.sbatch_wrap(
        "sleep 1", ["--partition=urgent", f"--nodelist={nodes}", "--exclusive", "--output=/dev/null"]
    )
    theirs = [
        testbed.client.sbatch_wrap("sleep 2", ["--nodes=1", "--job-name=not-ours", "--output=/dev/null"]),
        testbed.client.sbatch_wrap("exit 3", ["--nodes=1", "--job-name=fails", "--output=/dev/null"]),
    ]
    assert wait_state(testbed, ours.job_id, timeout_s=240) is JobState.COMPLETED
    for job_id in (urgent, *theirs):
        wait_state(testbed, job_id)
    time.sleep(2)  # accounting lags the controller
    until_s = time.time()
    result = cli(
        testbed,
        "fleet",
        "report",
        "--since",
        f"{since_s:.0f}",
        "--until",
        f"{until_s:.0f}",
        "--root",
        str(runs),
        "--json",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    since_s, until_s = report["window"]["since_s"], report["window"]["until_s"]
    rows = sacct_says(testbed, since_s, until_s)
    expected = node_seconds(rows, since_s, until_s)
    assert {t["account"]: t["node_seconds"] for t in report["tenants"]} == pytest.approx(expected)
    waits = first_waits(rows, since_s, until_s)
    total = report["total"]
    assert total["queue_wait_s"]["max"] == max(waits)
    assert total["queue_wait_s"]["p50"] == waits[(len(waits) + 1) // 2 - 1]
    preempted_events = [e for e in read_jsonl(RunDir(ours.run_dir).events) if e.get("kind") == "preempted"]
    theirs_preempted = sum(r["State"] == "PREEMPTED" for r in rows if r["JobIDRaw"] != ours.job_id)
    assert len(preempted_events) == 1
    seen = f"report:\n{json.dumps(report, indent=1)}\nsacct:\n{rows}\nstderr:\n{result.stderr}"
    seen += f"\nevents: {preempted_events}"
    assert total["preemptions"] == len(preempted_events) + theirs_preempted, seen
    assert total["jobs"] == len({r["JobIDRaw"] for r in rows}) and total["jobs_with_records"] == 1
    assert total["failures"]["application"] >= 1  # `exit 3`
    assert any(w["name"] == "fleet-preempted" and w["ours"] for w in report["worst_jobs"]), report["worst_jobs"]
    assert report["sacct"]["malformed"] == 0
