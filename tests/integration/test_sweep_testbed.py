"""A sweep on the real testbed: one job array, elements run two at a time, one preempted and resumed bit for bit.

Four gpt-tiny elements (TP2 on one node each, a few steps) sweep the learning rate and the seed with
``--max-parallel 2``. sacct sees one array with four tasks; element 3 gets a real
``scancel --signal=USR2 --batch`` on its task mid-run, saves, requeues as that task alone and ends
exactly like an uninterrupted local run of the same settings. ``runs --sweep`` lists the elements
best first, and ``cancel SWEEP`` ends every element of a second sweep.
"""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from air_hpc.config.load import load_job
from air_hpc.exitcodes import ExitCode
from air_hpc.observe.compare import shard_hashes
from air_hpc.records.events import read_events
from air_hpc.records.jsonl import read_jsonl
from air_hpc.records.metrics import read_metrics
from air_hpc.records.rundir import RunDir
from air_hpc.slurm.client import ONCE
from air_hpc.train import data
from tests.integration.local_run import submit_local
from tests.integration.waiting import wait_ended, wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
STEPS = 6
ONE_NODE_TP2 = ["resources.nodes=1", "resources.tasks_per_node=2", "parallel.tp=2", "parallel.pp=1"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data") / "corpus.h5"
    data.prepare(data.project_sources(), out, data.ByteTokenizer())
    return out


def common(root: Path, corpus: Path) -> list[str]:
    return [
        f"run.root={root}",
        f"data.path={corpus}",
        f"train.steps={STEPS}",
        "checkpoint.interval_steps=3",
        "checkpoint.keep_last=10",
        "health.preflight=false",
        *ONE_NODE_TP2,
    ]


def air_hpc(testbed: Any, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **testbed.env}
    return subprocess.run(
        [sys.executable, "-m", "air_hpc", *args],
        env=env,
        cwd=REPO,
        text=True,
        capture_output=True,
        timeout=300,
        check=False,
    )


def last_step(run_dir: RunDir) -> int:
    records = read_metrics(run_dir.metrics) if run_dir.metrics.exists() else []
    return max((int(r["step"]) for r in records), default=0)


def kinds(run_dir: RunDir, kind: str) -> list[dict[str, Any]]:
    return [e for e in read_events(run_dir.events) if e["kind"] == kind] if run_dir.events.exists() else []


def test_a_sweep_is_one_array_and_a_preempted_element_resumes_bit_for_bit(
    testbed: Any, corpus: Path, tmp_path: Path
) -> None:
    sets = [
        f"--set={s}" for s in [*common(tmp_path / "runs", corpus), f"cluster.topology_file={testbed.topology_conf}"]
    ]
    args = ["sweep", "configs/jobs/gpt-tiny-testbed.yaml", *sets, "--set=run.name=sw", "--max-parallel", "2"]
    done = air_hpc(testbed, *args, "--grid", "train.lr=0.001,0.002", "--grid", "train.seed=1,2")
    assert done.returncode == 0, done.stderr
    array = done.stdout.strip()
    runs = [RunDir(tmp_path / "runs" / f"sw-{i}") for i in range(4)]
    assert runs[3].read_job().run.sweep.overrides == {"train.lr": "0.002", "train.seed": "2"}  # type: ignore[union-attr]

    # Element 3 starts last, once no task of the array is pending: Slurm 22.05 answers a signal to a task whose
    # array still has pending tasks with "Job can not be altered now" (delivering it), and scancel keeps asking.
    wait_for("element 3 at step 1", lambda: last_step(runs[3]) >= 1, timeout_s=600, poll_s=0.2)
    testbed.client.scancel(f"{array}_3", signal="USR2", batch=True, retry=ONCE)  # a retry could signal twice
    wait_for("element 3 resumed", lambda: kinds(runs[3], "resume"), timeout_s=300)
    for i in range(4):
        assert wait_ended(testbed.client, f"{array}_{i}", timeout_s=600).state.succeeded, "\n".join(
            p.read_text()[-1500:] for p in sorted(runs[i].logs.glob("*"))
        )

    accounted = testbed.client.run(["sacct", "-n", "-X", "-P", "-j", array, "-o", "JobID"]).stdout.split()
    assert set(accounted) == {f"{array}_{i}" for i in range(4)}  # one array, four tasks (a requeue repeats one)
    starts = [r["job_id"] for r in read_jsonl(runs[3].submissions) if r.get("kind") == "started"]
    assert starts == [f"{array}_3", f"{array}_3"]  # the element requeued as its own task
    assert all(len([r for r in read_jsonl(r.submissions) if r.get("kind") == "started"]) == 1 for r in runs[:3])

    reference = load_job(
        REPO / "configs/jobs/gpt-tiny-local.yaml",
        [*common(tmp_path / "reference", corpus), "run.name=ref", "train.lr=0.002", "train.seed=2"],
    )
    ref_dir, handle = submit_local(reference, 10)
    assert [r.exit_code for r in handle.results()] == [ExitCode.OK] * 2
    (stop,) = kinds(runs[3], "stop")
    assert [e["step"] for e in kinds(runs[3], "resume")] == [stop["step"]] and stop["step"] < STEPS
    assert [(r["step"], r["loss"]) for r in read_metrics(runs[3].metrics)] == [
        (r["step"], r["loss"]) for r in read_metrics(ref_dir.metrics)
    ]
    assert shard_hashes(runs[3], STEPS) == shard_hashes(ref_dir, STEPS)

    listed = air_hpc(testbed, "runs", "--sweep", "sw", f"--root={tmp_path / 'runs'}", "--json")
    assert listed.returncode == 0, listed.stderr
    elements = json.loads(listed.stdout)["elements"]
    assert sorted(e["index"] for e in elements) == [0, 1, 2, 3]
    assert {e["state"] for e in elements} == {"COMPLETED"} and {e["step"] for e in elements} == {STEPS}
    losses = [e["loss"] for e in elements]
    assert losses == sorted(losses)  # best first


def test_cancel_sweep_ends_every_element(testbed: Any, corpus: Path, tmp_path: Path) -> None:
    sets = [
        f"--set={s}" for s in [*common(tmp_path / "runs", corpus), f"cluster.topology_file={testbed.topology_conf}"]
    ]
    args = ["sweep", "configs/jobs/gpt-tiny-testbed.yaml", *sets, "--set=run.name=long", "--set=train.steps=100000"]
    done = air_hpc(testbed, *args, "--grid", "train.seed=1,2,3", "--max-parallel", "2")
    assert done.returncode == 0, done.stderr
    array = done.stdout.strip()
    wait_for("element 0 training", lambda: last_step(RunDir(tmp_path / "runs" / "long-0")) >= 1, timeout_s=300)
    cancelled = air_hpc(testbed, "cancel", str(tmp_path / "runs" / "long.sweep"), "--json")
    assert cancelled.returncode == 0, cancelled.stderr
    assert [e["cancelled"] for e in json.loads(cancelled.stdout)["elements"]] == [True, True, True]
    for i in range(3):
        assert str(wait_ended(testbed.client, f"{array}_{i}", timeout_s=120).state) == "CANCELLED"
