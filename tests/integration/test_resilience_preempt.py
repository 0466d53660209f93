"""A TP2xPP2 gpt-tiny run preempted twice ends exactly like an uninterrupted one: locally and on the testbed.

Through submitit's LocalExecutor the task processes and everything they started are signalled
(``job._interrupt()`` would only reach submitit's controller). On the testbed the batch shell
gets ``scancel --signal=USR2 --batch``, forwards it to the ``srun`` step, and requeues on the
ranks' exit code. Each time the ranks agree at a step boundary, save synchronously, and the
next start resumes. Both are compared with one uninterrupted run on this machine.
"""

import contextlib
import json
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from air_hpc.config.load import load_job
from air_hpc.exitcodes import ExitCode
from air_hpc.launch.submit import submit as submit_slurm
from air_hpc.resilience.events import read_events
from air_hpc.rundir import RunDir
from air_hpc.train import data
from air_hpc.train.metrics import read_metrics
from tests.integration.local_run import submit_local
from tests.integration.waiting import wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
STEPS = 10  # room for two stops that land a few steps after their signals


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data") / "corpus.h5"
    data.prepare(data.project_sources(), out, data.ByteTokenizer())
    return out


def job_overrides(root: Path, corpus: Path, name: str) -> list[str]:
    return [
        f"run.name={name}",
        f"run.root={root}",
        f"data.path={corpus}",
        f"train.steps={STEPS}",
        "checkpoint.interval_steps=3",
        "checkpoint.keep_last=10",
        "health.preflight=false",
    ]


def submit(root: Path, corpus: Path, name: str) -> tuple[RunDir, Any]:
    """Through submitit's LocalExecutor on this machine."""
    return submit_local(load_job(REPO / "configs/jobs/gpt-tiny-local.yaml", job_overrides(root, corpus, name)), 10)


def last_step(run_dir: RunDir) -> int:
    records = read_metrics(run_dir.metrics) if run_dir.metrics.exists() else []
    return max((int(r["step"]) for r in records), default=0)


def kinds(run_dir: RunDir, kind: str) -> list[dict[str, Any]]:
    return [e for e in read_events(run_dir.events) if e["kind"] == kind]


def signal_tasks(handle: Any, expected: int = 4) -> None:
    """Signal the tasks and every process they started, as slurmstepd does with a step's processes."""
    tasks = psutil.Process(int(handle.job_id)).children()
    assert len(tasks) == expected
    for proc in [*tasks, *(c for t in tasks for c in t.children(recursive=True))]:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGUSR2)


def shard_hashes(run_dir: RunDir, step: int) -> dict[str, str]:
    manifest = json.loads((run_dir.checkpoints / f"step_{step:07d}" / "manifest.json").read_text())
    return {f["path"]: f["sha256"] for f in manifest["files"] if f["path"].endswith(".distcp")}


@pytest.fixture(scope="module")
def reference(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> RunDir:
    run_dir, handle = submit(tmp_path_factory.mktemp("reference"), corpus, "reference")
    assert [r.exit_code for r in handle.results()] == [ExitCode.OK] * 4
    return run_dir


def preempt_twice(run_dir: RunDir, send: Any) -> list[float]:
    """Signal after the first step of each start; returns when the second resume happened."""
    signalled = []
    for round_ in range(2):
        resumed = kinds(run_dir, "resume")
        since = resumed[-1]["step"] if resumed else 0
        wait_for(f"step {since + 1}", lambda since=since: last_step(run_dir) >= since + 1, timeout_s=300)
        signalled.append(time.time())
        send()
        wait_for(f"resume {round_ + 1}", lambda n=round_ + 1: len(kinds(run_dir, "resume")) >= n, timeout_s=300)
    return signalled


def check_like_reference(run_dir: RunDir, reference: RunDir, signalled: list[float]) -> None:
    records = read_metrics(run_dir.metrics)
    expected = [(r["step"], r["loss"]) for r in read_metrics(reference.metrics)]
    assert len(expected) == STEPS
    assert [(r["step"], r["loss"]) for r in records] == expected
    stops, resumes = kinds(run_dir, "stop"), kinds(run_dir, "resume")
    assert [e["reason"] for e in stops] == ["signal", "signal"]
    assert [e["step"] for e in resumes] == [e["step"] for e in stops]  # no step lost
    assert stops[0]["step"] < stops[1]["step"] < STEPS
    assert all(e["rng_restored"] and not e["layout_changed"] for e in resumes)
    saved = {e["step"]: e for e in kinds(run_dir, "checkpoint_saved")}
    assert all(saved[e["step"]]["async"] is False for e in stops)  # preemption saves are synchronous
    assert shard_hashes(run_dir, STEPS) == shard_hashes(reference, STEPS)  # the final weights, byte for byte
    for sent, stop in zip(signalled, stops, strict=True):
        first_resumed = next(r for r in records if r["step"] == stop["step"] + 1)
        print(f"signal at step {stop['step']}: first resumed step {first_resumed['time'] - sent:.1f} s later")


def test_preempted_twice_locally_matches_an_uninterrupted_run(corpus: Path, reference: RunDir, tmp_path: Path) -> None:
    run_dir, handle = submit(tmp_path, corpus, "preempted")
    signalled = preempt_twice(run_dir, lambda: signal_tasks(handle))
    assert [r.exit_code for r in handle.results()] == [ExitCode.OK] * 4
    check_like_reference(run_dir, reference, signalled)


def test_testbed_job_preempted_twice_finishes_on_its_own_identically(
    testbed: Any, corpus: Path, reference: RunDir, tmp_path: Path
) -> None:
    job = load_job(
        REPO / "configs/jobs/gpt-tiny-testbed.yaml",
        [*job_overrides(tmp_path, corpus, "testbed"), f"cluster.topology_file={testbed.topology_conf}"],
    )
    done = submit_slurm(job, "slurm", testbed.client)
    run_dir = RunDir(done.run_dir)
    signalled = preempt_twice(run_dir, lambda: testbed.client.scancel(done.job_id, signal="USR2", batch=True))
    state = testbed.wait_job(done.job_id, timeout_s=300)
    assert state == "COMPLETED", "\n".join(p.read_text()[-1500:] for p in sorted(run_dir.logs.glob("*")))
    check_like_reference(run_dir, reference, signalled)


def test_submitit_job_on_the_testbed_requeues_on_the_configured_signal(
    testbed: Any, corpus: Path, reference: RunDir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """submitit's SlurmExecutor: Slurm signals the step's tasks, submitit's handler on rank 0 requeues."""
    monkeypatch.setenv("SLURM_CONF", testbed.env["SLURM_CONF"])  # submitit runs sbatch itself
    job = load_job(
        REPO / "configs/jobs/gpt-tiny-testbed.yaml",
        [
            *job_overrides(tmp_path, corpus, "submitit"),
            f"cluster.topology_file={testbed.topology_conf}",
            "resilience.signal=USR1",
        ],
    )
    done = submit_slurm(job, "submitit", testbed.client)
    run_dir = RunDir(done.run_dir)
    script = next((run_dir.path / "submitit").glob("*_submission.sh")).read_text()
    assert f"#SBATCH --signal=USR1@{job.resilience.signal_lead_s}\n" in script
    assert "export SUBMITIT_PREEMPT_SIGNAL=USR1\n" in script
    signalled = preempt_twice(run_dir, lambda: testbed.client.scancel(done.job_id, signal="USR1"))
    state = testbed.wait_job(done.job_id, timeout_s=300)
    logs = sorted((run_dir.path / "submitit").glob("*.err"))
    assert state == "COMPLETED", "\n".join(p.read_text()[-1500:] for p in logs)
    check_like_reference(run_dir, reference, signalled)
    assert [e["signal"] for e in kinds(run_dir, "stop")] == ["SIGUSR1", "SIGUSR1"]
