"""TensorBoard event files and Prometheus metrics of a real gpt-tiny run (4 local CPU ranks, TP2 x PP2).

The run is stopped by SIGUSR2 after step 2, saves, is requeued by submitit and
resumes: its event files must hold every step once (the resumed start purges
what the first start logged after its checkpoint) and the markers of both.
"""

import signal
import time
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from air_hpc.cli.main import cli
from air_hpc.config.load import load_job
from air_hpc.exitcodes import ExitCode
from air_hpc.records.events import read_events
from air_hpc.records.metrics import read_metrics
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import record_submission
from air_hpc.slurm.fake import FakeSlurm
from tests.integration.local_run import submit_local

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
STEPS = 6


@pytest.fixture(scope="module")
def preempted(tmp_path_factory: pytest.TempPathFactory, small_corpus: Path) -> RunDir:
    root = tmp_path_factory.mktemp("runs")
    job = load_job(
        REPO / "configs/jobs/gpt-tiny-local.yaml",
        [
            "run.name=board",
            f"run.root={root}",
            f"data.path={small_corpus}",
            f"train.steps={STEPS}",
            "checkpoint.interval_steps=4",
            "health.preflight=false",
            "observe.tensorboard=true",
        ],
    )
    run_dir, handle = submit_local(job, timeout_min=5)
    record_submission(run_dir, handle.job_id, "local")
    deadline = time.monotonic() + 120
    while len(read_metrics(run_dir.metrics)) < 2:
        assert time.monotonic() < deadline, "the run never reached step 2"
        time.sleep(0.1)
    for task in psutil.Process(int(handle.job_id)).children():
        task.send_signal(signal.SIGUSR2)
    assert [r.exit_code for r in handle.results()] == [ExitCode.OK] * 4
    return run_dir


def test_tensorboard_holds_every_step_once_and_the_markers(preempted: RunDir) -> None:
    events = EventAccumulator(str(preempted.tensorboard), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    metrics = read_metrics(preempted.metrics)
    loss = events.Scalars("train/loss")
    assert [e.step for e in loss] == list(range(1, STEPS + 1))
    assert [e.value for e in loss] == pytest.approx([m["loss"] for m in metrics], rel=1e-6)
    assert [e.value for e in events.Scalars("train/lr")] == pytest.approx([m["lr"] for m in metrics], rel=1e-6)
    assert len(events.Scalars("perf/tokens_per_s")) == STEPS
    stop = next(e for e in read_events(preempted.events) if e["kind"] == "stop")
    assert [(e.step, e.value) for e in events.Scalars("markers/stop_step")] == [(stop["step"], stop["step"])]
    assert [(e.step, e.value) for e in events.Scalars("markers/resumed_from_step")] == [
        (stop["step"] + 1, stop["step"])
    ]
    saved = sorted({e.step for e in events.Scalars("markers/checkpoint_step")})
    assert saved == sorted({stop["step"], 4, STEPS})
    notes = [e.tensor_proto.string_val[0].decode() for e in events.Tensors("markers/text_summary")]
    assert f"resumed from the checkpoint of step {stop['step']}" in notes
    files = sorted(p.name for p in preempted.tensorboard.iterdir())
    assert len(files) == 2 and all(name.startswith("events.out.tfevents.") for name in files)  # one per start
    assert not list(preempted.path.glob("rank-*/**/events.out.tfevents.*"))  # only the rank that has the loss


def test_metrics_textfile_of_the_finished_run(preempted: RunDir, tmp_path: Path) -> None:
    out = tmp_path / "air_hpc.prom"
    result = CliRunner().invoke(
        cli,
        ["metrics", "--root", str(preempted.path.parent), "--textfile", str(out)],
        obj={"slurm_client": FakeSlurm()},
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    got = {
        (s.name, s.labels.get("state")): s.value
        for family in text_string_to_metric_families(out.read_text())
        for s in family.samples
        if s.labels.get("run") == "board"
    }
    assert got[("air_hpc_run_step", None)] == STEPS
    assert got[("air_hpc_run_loss", None)] == pytest.approx(read_metrics(preempted.metrics)[-1]["loss"])
    assert got[("air_hpc_run_restarts_total", None)] == 1
    assert got[("air_hpc_run_state", "completed")] == 1
    assert 0 < got[("air_hpc_run_goodput_ratio", None)] < 1
    assert got[("air_hpc_run_heartbeat_age_seconds", None)] >= 0
    assert got[("air_hpc_run_tokens_per_second", None)] > 0
