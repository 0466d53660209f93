"""The ground truth of a simulated workload (``fleet simulate --out``): every job as the workload itself saw it.

Nothing here asks ``sacct``: a report built from accounting is checked against this. Submit times are
this process's clock as ``sbatch`` returned; a training's starts and ends come from its own records
(``submissions.jsonl``: ``started`` per start; the batch script's events of that start for its end), its
preemptions from its ``preempted`` events; a short job's start and end from the marks it wrote itself.
"""

import getpass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from air_hpc.records.events import read_events
from air_hpc.records.jsonl import read_jsonl
from air_hpc.records.rundir import RunDir
from air_hpc.testbed.tenants import QOS_TIERS, TENANTS, node_quota

if TYPE_CHECKING:
    from air_hpc.fleet.simulate import Submitted, Workload

#: Version of the ground truth's layout, for readers.
TRUTH_FORMAT = 1


def training_starts(submissions: list[dict[str, Any]], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each start of a run (``started`` in ``submissions.jsonl``): its start, its nodes, and its end: the last event
    the batch script wrote for that start (``step_ended``, ``preempted``, ``requeue``; None while it runs). Pure."""
    ends: dict[tuple[str, int], float] = {}
    for event in events:
        if "restart_count" in event and "job_id" in event:
            key = (str(event["job_id"]), int(event["restart_count"]))
            ends[key] = max(float(event["time"]), ends.get(key, 0.0))
    return [
        {
            "start_s": entry["time"],
            "end_s": ends.get((str(entry.get("job_id")), int(entry.get("restart_count", 0)))),
            "nodelist": entry.get("nodelist", ""),
        }
        for entry in submissions
        if entry.get("kind") == "started"
    ]


def read_mark(path: Path) -> float | None:
    """A time a job wrote itself (``date +%s.%N``); None when it never got there (cancelled, killed)."""
    try:
        return float(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _observed(job: "Submitted", marks: Path) -> tuple[list[dict[str, Any]], int]:
    """The job's starts, and how often it was preempted."""
    if job.run_dir is not None:
        run_dir = RunDir(job.run_dir)
        events = read_events(run_dir.events) if run_dir.events.is_file() else []
        preempted = sum(1 for e in events if e.get("kind") == "preempted")
        return training_starts(read_jsonl(run_dir.submissions), events), preempted
    start = read_mark(marks / f"{job.planned.name}.start")
    if start is None:
        return [], 0
    return [{"start_s": start, "end_s": read_mark(marks / f"{job.planned.name}.end"), "nodelist": ""}], 0


def _injected(job: "Submitted") -> dict[str, Any] | None:
    if job.planned.crash_after_step:
        return {"kind": "application", "how": job.crashed or "a rank was to be killed; it was not", "exit_code": None}
    if job.planned.kind == "failure":
        from air_hpc.fleet.simulate import FAILURE_EXIT_CODE

        return {"kind": "application", "how": f"exits {FAILURE_EXIT_CODE}", "exit_code": FAILURE_EXIT_CODE}
    if job.planned.kind == "cancelled":
        return {"kind": "user", "how": "scancel while it runs", "at_s": job.cancelled_s}
    return None


def job_truth(job: "Submitted", jobs: dict[str, "Submitted"], marks: Path) -> dict[str, Any]:
    planned = job.planned
    starts, preempted = _observed(job, marks)
    victim = jobs[planned.victim].job_id if planned.victim else None
    expected = {
        "preemptions": planned.expected_preemptions,
        "requeues": planned.expected_requeues,
        "state": planned.expected_state,
    }
    observed = {"preemptions": preempted, "requeues": max(len(starts) - 1, 0), "state": job.state}
    return {
        "name": planned.name,
        "kind": planned.kind,
        "job_id": job.job_id,
        "user": planned.user or getpass.getuser(),
        "account": planned.account,
        "qos": planned.qos,
        "nodes": 1,
        "run_dir": str(job.run_dir) if job.run_dir else None,
        "submit_s": job.submit_s,
        "start_s": starts[0]["start_s"] if starts else None,
        "end_s": starts[-1]["end_s"] if starts else None,
        "starts": starts,
        "preempts": victim,
        "preempted_by": [j.job_id for j in jobs.values() if j.planned.victim == planned.name],
        "injected_failure": _injected(job),
        "expected": expected,
        "observed": observed,
        "ok": expected == observed,
    }


def _totals(jobs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    totals: dict[str, dict[str, Any]] = {}
    for job in jobs:
        mine = totals.setdefault(
            job["account"],
            {
                "jobs": 0,
                "preemptions": 0,
                "requeues": 0,
                "failures": {"infrastructure": 0, "application": 0, "user": 0},
            },
        )
        mine["jobs"] += 1
        mine["preemptions"] += job["observed"]["preemptions"]
        mine["requeues"] += job["observed"]["requeues"]
        if job["injected_failure"]:
            mine["failures"][job["injected_failure"]["kind"]] += 1
    return totals


def ground_truth(workload: "Workload", seed: int, end_s: float) -> dict[str, Any]:
    """The whole ground truth of a workload that has ended."""
    jobs = [job_truth(job, workload.jobs, workload.marks) for job in workload.jobs.values()]
    return {
        "format": TRUTH_FORMAT,
        "seed": seed,
        "job_count": len(jobs),
        "cluster": workload.cluster,
        "runs_root": str(workload.root),
        "window": {"start_s": workload.started_s, "end_s": end_s},
        "tenants": [
            {"account": t.account, "fairshare": t.fairshare, "node_quota": node_quota(t, workload.nodes)}
            for t in TENANTS
        ],
        "qos": [{"name": q.name, "priority": q.priority, "preempts": list(q.preempts)} for q in QOS_TIERS],
        "jobs": jobs,
        "totals": _totals(jobs),
        "ok": all(job["ok"] for job in jobs),
    }
