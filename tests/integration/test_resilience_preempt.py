"""A TP2xPP2 gpt-tiny run preempted twice ends exactly like an uninterrupted one: locally and on the testbed.

Through submitit's LocalExecutor the task processes and everything they started are signalled
(``job._interrupt()`` would only reach submitit's controller). On the testbed the batch shell
gets ``scancel --signal=USR2 --batch``, forwards it to the ``srun`` step, and requeues on the
ranks' exit code. Each time the ranks agree at a step boundary, save synchronously, and the
next start resumes. Both are compared with one uninterrupted run on this machine.
"""

import contextlib
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from air_hpc.config.load import load_job
from air_hpc.exitcodes import ExitCode
from air_hpc.launch.submit import submit as submit_slurm
from air_hpc.observe.compare import shard_hashes
from air_hpc.observe.records import load_records
from air_hpc.observe.report import build_report, format_report
from air_hpc.records.events import read_events
from air_hpc.records.jsonl import read_jsonl
from air_hpc.records.metrics import read_metrics
from air_hpc.records.rundir import RunDir
from air_hpc.slurm.jobs import SLURM_REQUEUES_PREEMPTED_FROM
from air_hpc.testbed import Testbed
from air_hpc.testbed.conf import Settings
from air_hpc.train import data
from tests.integration.local_run import submit_local
from tests.integration.step_injection import step_injection
from tests.integration.waiting import wait_ended, wait_for

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
    assert [e["reason"] for e in stops] == ["signal"] * len(signalled)
    assert [e["step"] for e in resumes] == [e["step"] for e in stops]  # no step lost
    assert [e["step"] for e in stops] == sorted({e["step"] for e in stops}) and stops[-1]["step"] < STEPS
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
    for key, value in testbed.env.items():  # submitit runs sbatch itself (PATH: a Slurm build's first)
        monkeypatch.setenv(key, value)
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


def slurm_requeues_preempted_jobs(testbed: Any) -> bool:
    """Slurm 24.05 and newer requeue a preempted job that ends within its GraceTime; older ones do not."""
    return bool(testbed.client.version() >= SLURM_REQUEUES_PREEMPTED_FROM)


def test_testbed_job_preempted_by_slurm_saves_in_grace_requeues_once_and_matches(
    testbed: Any, corpus: Path, reference: RunDir, tmp_path: Path
) -> None:
    """A job in `urgent` preempts the run (partition_prio, PreemptMode=REQUEUE): Slurm sends the step SIGTERM,
    the ranks save within GraceTime, the job is requeued exactly once (by Slurm or, before 24.05, by the batch
    script) and ends like the uninterrupted run."""
    job = load_job(
        REPO / "configs/jobs/gpt-tiny-testbed.yaml",
        [*job_overrides(tmp_path, corpus, "slurm-preempted"), f"cluster.topology_file={testbed.topology_conf}"],
    )
    done = submit_slurm(job, "slurm", testbed.client)
    run_dir = RunDir(done.run_dir)
    wait_for("step 2", lambda: last_step(run_dir) >= 2, timeout_s=300)
    nodes = (testbed.client.show_job(done.job_id) or {})["NodeList"]
    signalled = time.time()
    urgent = testbed.client.sbatch_wrap(
        "sleep 1", ["--partition=urgent", f"--nodelist={nodes}", "--exclusive", "--output=/dev/null"]
    )
    wait_for("resume", lambda: len(kinds(run_dir, "resume")) >= 1, timeout_s=300)
    state = testbed.wait_job(done.job_id, timeout_s=300)
    assert state == "COMPLETED", "\n".join(p.read_text()[-1500:] for p in sorted(run_dir.logs.glob("*")))
    assert wait_ended(testbed.client, urgent, timeout_s=60).state.succeeded
    check_like_reference(run_dir, reference, [signalled])
    assert [e["signal"] for e in kinds(run_dir, "stop")] == ["SIGTERM"]
    (preempted,) = kinds(run_dir, "preempted")
    assert preempted["fit"] is True and preempted["grace_s"] == 30
    assert preempted["requeue_by"] == ("slurm" if slurm_requeues_preempted_jobs(testbed) else "batch")
    assert kinds(run_dir, "requeue") == []  # not the batch script's ordinary requeue as well
    starts = [r for r in read_jsonl(run_dir.submissions) if r.get("kind") == "started"]
    assert [r["restart_count"] for r in starts] == [0, 1]  # requeued exactly once
    print(f"preemption save: step ended {preempted['ended_after_s']} s into a {preempted['grace_s']} s grace time")


#: On the first start every rank waits up to 15 s before each step (sitecustomize on the job's PYTHONPATH), so
#: the run cannot finish within its two-minute time limit however fast it starts; the wait ends as soon as the
#: rank's stop handler sees the signal, so the stop is not delayed. Later starts train at full speed.
FIRST_START = 'os.environ.get("SLURM_RESTART_COUNT", "0") == "0"'
SLOW_FIRST_START_PRELUDE = f"""
stopped = threading.Event()
_install = signal.signal


def _chained(signum, handler):
    if signum == signal.SIGUSR2 and callable(handler):
        inner = handler

        def handler(number, frame):
            stopped.set()
            inner(number, frame)

    return _install(signum, handler)


if {FIRST_START}:
    signal.signal = _chained
"""
SLOW_FIRST_START_STEP = """
def step(self, consumed):
    stopped.wait(15)
    return original(self, consumed)
"""


def test_testbed_job_at_its_time_limit_gets_the_signal_saves_requeues_and_matches(
    testbed: Any, corpus: Path, reference: RunDir, tmp_path: Path
) -> None:
    """--time=2 with --signal=B:USR2@20: Slurm signals the batch shell 20 to 50 s before the limit (it checks
    every 30 s), the ranks save, the batch script requeues (this is not Slurm's preemption), and the run ends
    like the uninterrupted one."""
    job = load_job(
        REPO / "configs/jobs/gpt-tiny-testbed.yaml",
        [
            *job_overrides(tmp_path, corpus, "time-limit"),
            f"cluster.topology_file={testbed.topology_conf}",
            "resources.time_limit_min=2",
            "resilience.signal_lead_s=20",
            "resilience.max_restarts=5",
            "resilience.time_margin_s=0",
            step_injection(
                tmp_path / "inject", SLOW_FIRST_START_STEP, when=FIRST_START, prelude=SLOW_FIRST_START_PRELUDE
            ),
        ],
    )
    done = submit_slurm(job, "slurm", testbed.client)
    run_dir = RunDir(done.run_dir)
    state = testbed.wait_job(done.job_id, timeout_s=600)
    assert state == "COMPLETED", "\n".join(p.read_text()[-1500:] for p in sorted(run_dir.logs.glob("*")))
    signals = kinds(run_dir, "signal")
    assert signals and [e["signal"] for e in signals] == ["SIGUSR2"] * len(signals)
    check_like_reference(run_dir, reference, [e["time"] for e in signals])
    assert [e["signal"] for e in kinds(run_dir, "stop")] == ["SIGUSR2"] * len(signals)
    assert len(kinds(run_dir, "requeue")) == len(signals) and kinds(run_dir, "preempted") == []
    starts = [r for r in read_jsonl(run_dir.submissions) if r.get("kind") == "started"]
    assert [r["restart_count"] for r in starts] == list(range(len(signals) + 1))


def test_auto_interval_checkpoints_on_its_chosen_steps_and_trains_like_a_fixed_one(
    corpus: Path, reference: RunDir, tmp_path: Path
) -> None:
    """checkpoint.interval_steps: auto measures the save at step 1, picks Daly's interval for MTBF 36 s, saves on
    that schedule, logs the choice, and the report compares the expected and the measured loss."""
    overrides = [*job_overrides(tmp_path, corpus, "auto"), "checkpoint.interval_steps=auto", "resilience.mtbf_h=0.01"]
    run_dir, handle = submit_local(load_job(REPO / "configs/jobs/gpt-tiny-local.yaml", overrides), 10)
    assert [r.exit_code for r in handle.results()] == [ExitCode.OK] * 4
    losses = [(r["step"], r["loss"]) for r in read_metrics(run_dir.metrics)]
    assert losses == [(r["step"], r["loss"]) for r in read_metrics(reference.metrics)]
    assert shard_hashes(run_dir, STEPS) == shard_hashes(reference, STEPS)
    choices = kinds(run_dir, "checkpoint_interval")
    assert choices and choices[0]["step"] == 1 and all(c["steps"] >= 1 and c["mtbf_h"] == 0.01 for c in choices)
    saved = [e["step"] for e in kinds(run_dir, "checkpoint_saved") if e["reason"] == "interval"]
    expected, last, choice = [1], 1, choices[0]["steps"]
    for step in range(2, STEPS):
        choice = next((c["steps"] for c in reversed(choices) if c["step"] <= last), choice)
        if step - last >= choice:
            expected.append(step)
            last = step
    assert saved == expected
    report = build_report(load_records(run_dir))
    assert report is not None and report.auto_interval is not None
    assert report.auto_interval.expected_waste == choices[-1]["expected_waste"]
    line = next(x for x in format_report(report).splitlines() if x.startswith("interval     auto"))
    print(line)


def test_preemption_with_the_user_signal_reaches_the_batch_shell_and_requeues_once(
    corpus: Path, reference: RunDir, tmp_path: Path
) -> None:
    """A cluster with SlurmctldParameters=preempt_send_user_signal (a testbed of its own) sends the job's
    --signal (USR2, to the batch shell) instead of SIGTERM to the step: the same save, the same single requeue."""
    bed = Testbed(tmp_path / "testbed")
    bed.up((2,), settings=Settings(preempt_send_user_signal=True))
    try:
        client = bed.client()
        job = load_job(
            REPO / "configs/jobs/gpt-tiny-testbed.yaml",
            [*job_overrides(tmp_path, corpus, "user-signal"), f"cluster.topology_file={bed.layout.topology_conf}"],
        )
        done = submit_slurm(job, "slurm", client)
        run_dir = RunDir(done.run_dir)
        wait_for("step 2", lambda: last_step(run_dir) >= 2, timeout_s=300)
        client.run(["sbatch", "--partition=urgent", "--nodes=2", "--exclusive", "--output=/dev/null", "--wrap=true"])
        assert wait_ended(client, done.job_id, timeout_s=400).state.succeeded
        signals = kinds(run_dir, "signal")
        assert [e["signal"] for e in signals] == ["SIGUSR2"]
        check_like_reference(run_dir, reference, [signals[0]["time"]])
        assert [e["signal"] for e in kinds(run_dir, "stop")] == ["SIGUSR2"]
        (preempted,) = kinds(run_dir, "preempted")
        assert preempted["fit"] is True and kinds(run_dir, "requeue") == []
        starts = [r for r in read_jsonl(run_dir.submissions) if r.get("kind") == "started"]
        assert [r["restart_count"] for r in starts] == [0, 1]
    finally:
        bed.down()
