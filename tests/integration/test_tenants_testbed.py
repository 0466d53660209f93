"""Tenants on the real testbed (``testbed up --tenants``): accounts, users, QOS tiers and node quotas in slurmdbd,
enforced by slurmctld; a run held by its tenant's quota says so in plain words; a ``high`` job preempts a
``scavenger`` run (preempt/qos, PreemptMode=REQUEUE), which saves in its QOS's GraceTime and resumes.

One tenants testbed for the module (4 nodes on two leaves: quotas research 3, product 2, ops 2).
"""

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from air_hpc.config.load import load_job
from air_hpc.errors import JobRefusedError
from air_hpc.launch.submit import submit
from air_hpc.records.events import read_events
from air_hpc.records.jsonl import read_jsonl
from air_hpc.records.metrics import read_metrics
from air_hpc.records.rundir import RunDir
from air_hpc.slurm.client import SlurmClient
from air_hpc.slurm.jobs import JobState, slurm_epoch
from air_hpc.slurm.reasons import plain_reason
from air_hpc.testbed import Testbed
from air_hpc.testbed.conf import Settings
from air_hpc.train import data
from tests.integration.step_injection import slow_steps_override
from tests.integration.test_jobs_testbed import AIR_HPC, PAYLOAD, cli, submit_payload, wait_state
from tests.integration.waiting import wait_ended, wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
LEAVES = (2, 2)
STEPS = 8


@pytest.fixture(scope="module")
def tenants_bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    shared = os.environ.get("AIR_HPC_TEST_STATE_DIR")
    state_dir = Path(f"{shared}-t") if shared else tmp_path_factory.mktemp("tenants")
    bed = Testbed(state_dir)
    status = bed.up(LEAVES, settings=Settings(tenants=True, preempt_by="qos"))
    try:
        client = bed.client()
        yield SimpleNamespace(testbed=bed, env=bed.env, client=client, nodes=status["nodes"])
    finally:
        bed.down()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data") / "corpus.h5"
    data.prepare(data.project_sources(), out, data.ByteTokenizer())
    return out


@pytest.fixture
def payload(tmp_path: Path) -> Path:
    path = tmp_path / "payload.py"
    path.write_text(PAYLOAD)
    return path


@pytest.fixture(autouse=True)
def empty_queue_after(tenants_bed: SimpleNamespace) -> Iterator[None]:
    yield
    tenants_bed.client.run(["scancel", "--full", "--user", "root"], check=False)
    wait_for("an empty queue", lambda: not tenants_bed.client.squeue(), timeout_s=60, poll_s=0.5)


def sacctmgr(client: SlurmClient, *args: str) -> list[list[str]]:
    return [line.split("|") for line in client.run(["sacctmgr", "-nP", "show", *args]).stdout.splitlines()]


def test_accounts_users_qos_and_quotas_are_in_slurmdbd_and_another_users_job_runs_as_them(
    tenants_bed: SimpleNamespace,
) -> None:
    client = tenants_bed.client
    assoc = sacctmgr(client, "assoc", "format=account,user,grptres,qos,defaultqos,fairshare")
    accounts = {row[0]: row for row in assoc if not row[1]}
    assert accounts["research"][2:] == ["node=3", "high,normal,scavenger", "normal", "50"]
    assert accounts["product"][2] == "node=2" and accounts["ops"][2] == "node=2"
    users = {(row[0], row[1]) for row in assoc if row[1]}
    assert {("research", "root"), ("product", "root"), ("ops", "root"), ("product", "nobody")} <= users
    assert ("research", "alice") in users, "slurmdbd takes a user without a Unix account"
    shares = [
        line.strip()
        for line in client.run(["sshare", "-a", "-P", "-n", "-o", "Account,User,RawShares"]).stdout.splitlines()
    ]
    assert {"research||50", "product||30", "ops||20"} <= set(shares), "fair shares as slurmctld sees them"
    config = client.run(["scontrol", "show", "config"]).stdout
    for setting in ("associations,limits,qos", "priority/multifactor", "preempt/qos"):
        assert setting in config
    qos = {row[0]: row for row in sacctmgr(client, "qos", "format=name,priority,preempt,preemptmode,gracetime")}
    assert qos["high"][1:3] == ["1000", "scavenger"] and qos["scavenger"][3:] == ["requeue", "00:00:30"]
    job_id = client.as_user("nobody").sbatch_wrap("true", ["--account=product", "--output=/dev/null", "--chdir=/tmp"])
    assert wait_ended(client, job_id, timeout_s=60).state is JobState.COMPLETED
    wait_for("accounting", lambda: sacctmgr_user(client, job_id) == "nobody|product|normal", timeout_s=30, poll_s=0.5)


def sacctmgr_user(client: SlurmClient, job_id: str) -> str:
    return client.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "User,Account,QOS"]).stdout.strip()


def test_a_run_held_by_its_tenants_node_quota_says_so_in_status_and_runs(
    tenants_bed: SimpleNamespace, tmp_path: Path, payload: Path
) -> None:
    client = tenants_bed.client
    blocker = client.sbatch_wrap("sleep 300", ["--account=ops", "--nodes=2", "--exclusive", "--output=/dev/null"])
    wait_for("the blocker to run", lambda: client.job_status(blocker).state is JobState.RUNNING, 60, 0.5)
    held = submit_payload(tenants_bed, tmp_path / "runs", payload, "quick", "held", "cluster.account=ops")
    wait_for("the quota hold", lambda: client.job_status(held.job_id).reason == "AssocGrpNodeLimit", 60, 0.5)
    words = plain_reason("AssocGrpNodeLimit")
    result = cli(tenants_bed, "status", str(held.run_dir), "--json")
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert (status["state"], status["reason"], status["reason_text"]) == ("PENDING", "AssocGrpNodeLimit", words)
    result = cli(tenants_bed, "status", str(held.run_dir))
    assert f"PENDING (AssocGrpNodeLimit: {words})" in result.stdout
    result = cli(tenants_bed, "runs", "--root", str(tmp_path / "runs"), "--json")
    (row,) = json.loads(result.stdout)["runs"]
    assert (row["state"], row["reason"], row["reason_text"]) == ("PENDING", "AssocGrpNodeLimit", words)
    assert words in cli(tenants_bed, "runs", "--root", str(tmp_path / "runs")).stdout
    client.scancel(blocker)
    assert wait_state(tenants_bed, held.job_id) is JobState.COMPLETED, "the quota, not the nodes, held it"


def test_a_job_naming_an_account_or_qos_it_may_not_use_is_refused_in_one_line(
    tenants_bed: SimpleNamespace, tmp_path: Path, payload: Path, corpus: Path
) -> None:
    with pytest.raises(JobRefusedError, match=r"check cluster\.account"):
        submit_payload(tenants_bed, tmp_path / "runs", payload, "quick", "nope", "cluster.account=nope")
    job = str(REPO / "configs/jobs/gpt-tiny-testbed.yaml")
    sets = [f"run.root={tmp_path}", f"data.path={corpus}", "cluster.qos=gold"]
    result = cli(tenants_bed, "submit", job, *(arg for value in sets for arg in ("--set", value)))
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: Slurm refused the job: ") and "Invalid qos" in line and "cluster.qos" in line


def kinds(run_dir: RunDir, kind: str) -> list[dict[str, Any]]:
    return [e for e in read_events(run_dir.events) if e["kind"] == kind]


def test_a_high_job_preempts_a_scavenger_run_which_saves_requeues_once_and_resumes(
    tenants_bed: SimpleNamespace, tmp_path: Path, corpus: Path
) -> None:
    overrides = [
        f"run.root={tmp_path}",
        "run.name=scavenged",
        f"data.path={corpus}",
        f"train.steps={STEPS}",
        "checkpoint.interval_steps=3",
        "health.preflight=false",
        f"cluster.topology_file={tenants_bed.testbed.layout.topology_conf}",
        "cluster.account=research",
        "cluster.qos=scavenger",
        slow_steps_override(tmp_path / "inject", 1.0),  # the high job lands while it trains, not after
    ]
    done = submit(load_job(REPO / "configs/jobs/gpt-tiny-testbed.yaml", overrides), "slurm", tenants_bed.client)
    run_dir = RunDir(done.run_dir)
    steps = lambda: [r["step"] for r in read_metrics(run_dir.metrics)] if run_dir.metrics.exists() else []  # noqa: E731
    wait_for("step 2", lambda: len(steps()) >= 2, timeout_s=300, poll_s=0.5)
    nodes = (tenants_bed.client.show_job(done.job_id) or {})["NodeList"]
    high = tenants_bed.client.sbatch_wrap(
        "sleep 1", ["--account=product", "--qos=high", f"--nodelist={nodes}", "--exclusive", "--output=/dev/null"]
    )
    assert wait_ended(tenants_bed.client, done.job_id, timeout_s=400).state is JobState.COMPLETED
    assert wait_ended(tenants_bed.client, high, timeout_s=60).state is JobState.COMPLETED
    (preempted,) = kinds(run_dir, "preempted")
    assert preempted["fit"] is True and preempted["grace_s"] == 30, "the scavenger QOS's GraceTime"
    assert [e["signal"] for e in kinds(run_dir, "stop")] == ["SIGTERM"]
    (stop,), (resume,) = kinds(run_dir, "stop"), kinds(run_dir, "resume")
    assert resume["step"] == stop["step"] < STEPS, "no step lost"
    assert sorted(set(steps())) == list(range(1, STEPS + 1))
    starts = [r for r in read_jsonl(run_dir.submissions) if r.get("kind") == "started"]
    assert [r["restart_count"] for r in starts] == [0, 1]  # requeued exactly once
    accounted = tenants_bed.client.run(
        ["sacct", "-n", "-X", "-P", "--duplicates", "-j", done.job_id, "-o", "State,Account,QOS"]
    ).stdout.split()
    # Before 24.05 the batch script requeues the preempted job itself, and accounting records that as REQUEUED.
    first = "PREEMPTED" if preempted["requeue_by"] == "slurm" else "REQUEUED"
    assert accounted == [f"{first}|research|scavenger", "COMPLETED|research|scavenger"]


def sacct_rows(client: SlurmClient, job_ids: list[str]) -> dict[str, list[dict[str, str]]]:
    fields = ["JobIDRaw", "User", "Account", "QOS", "State", "Submit", "Start"]
    out = client.run(
        ["sacct", "-a", "-X", "-P", "-n", "--duplicates", "-j", ",".join(job_ids), "-o", ",".join(fields)]
    ).stdout
    rows: dict[str, list[dict[str, str]]] = {}
    for line in out.splitlines():
        row = dict(zip(fields, line.split("|"), strict=True))
        rows.setdefault(row["JobIDRaw"], []).append(row)
    return rows


def test_a_simulated_workload_happens_as_planned_and_its_ground_truth_agrees_with_sacct(
    tenants_bed: SimpleNamespace, tmp_path: Path
) -> None:
    out = tmp_path / "truth.json"
    argv = ["fleet", "simulate", "--jobs", "8", "--seed", "3", "--out", str(out), "--root", str(tmp_path / "runs")]
    state = ["--state-dir", str(tenants_bed.testbed.layout.root)]
    result = subprocess.run(
        [AIR_HPC, *argv, *state], env={**os.environ, **tenants_bed.env}, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stdout + result.stderr
    truth = json.loads(out.read_text())
    assert truth["ok"] and truth["seed"] == 3 and truth["job_count"] == 8
    jobs = {job["name"]: job for job in truth["jobs"]}
    ids = [job["job_id"] for job in truth["jobs"]]
    final = {"COMPLETED", "FAILED", "CANCELLED"}
    wait_for(
        "accounting of every job",
        lambda: (
            all(rows[-1]["State"].split()[0] in final for rows in sacct_rows(tenants_bed.client, ids).values())
            and len(sacct_rows(tenants_bed.client, ids)) == len(ids)
        ),
        timeout_s=60,
        poll_s=1,
    )
    accounted = sacct_rows(tenants_bed.client, ids)
    for job in truth["jobs"]:
        rows = accounted[job["job_id"]]
        assert {(r["User"], r["Account"], r["QOS"]) for r in rows} == {(job["user"], job["account"], job["qos"])}
        assert len(rows) == 1 + job["observed"]["requeues"], job["name"]
        assert rows[-1]["State"].split()[0] == job["expected"]["state"], job["name"]
        assert abs(slurm_epoch(rows[0]["Submit"]) - job["submit_s"]) <= 2, "Slurm's Submit is whole seconds"
    (victim,) = [job for job in truth["jobs"] if job["qos"] == "scavenger"]
    (preemptor,) = [job for job in truth["jobs"] if job["kind"] == "preemptor"]
    assert victim["observed"]["preemptions"] == 1 and victim["preempted_by"] == [preemptor["job_id"]]
    first, second = victim["starts"]
    assert first["start_s"] < preemptor["start_s"] < second["start_s"], "preempted, then restarted after"
    assert {job["user"] for job in truth["jobs"] if job["kind"] != "training"} & {"nobody", "daemon"}
    assert jobs and truth["totals"]["research"]["preemptions"] == 1
    (crashed,) = [job for job in truth["jobs"] if job["kind"] == "training" and job["injected_failure"]]
    assert crashed["injected_failure"]["how"].startswith("SIGKILL rank 0") and len(crashed["starts"]) == 2
    assert sum(t["failures"]["application"] for t in truth["totals"].values()) == 2, "a job exits 3, a rank killed"
    assert sum(t["failures"]["user"] for t in truth["totals"].values()) == 1
