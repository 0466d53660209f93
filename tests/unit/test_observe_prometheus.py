"""``air-hpc metrics``: the textfile parsed and the endpoint scraped over loopback with prometheus_client's parsers."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_classic

from air_hpc.cli.main import cli, main
from air_hpc.config import load_job
from air_hpc.health.heartbeat import Heartbeat
from air_hpc.observe.prometheus import phase, registry_of, serve
from air_hpc.ops.states import snapshot
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import record_submission
from air_hpc.slurm.fake import FakeSlurm
from air_hpc.slurm.jobs import JobState
from tests.unit.test_observe_report import REPO, preempted_run

LOCAL_JOB = REPO / "configs" / "jobs" / "gpt-tiny-local.yaml"


def samples(text: str, parse: object = parse_classic) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) -> value, from text in either exposition format."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in parse(text)  # type: ignore[operator]
        for s in family.samples
    }


def fleet(root: Path) -> FakeSlurm:
    """Three runs under ``root``: a preempted Slurm run now running, one never submitted, one local that ended."""
    fake = FakeSlurm()
    run = preempted_run(root)  # run.name gpt-tiny-local, 10 of 20 steps
    job_id = fake.sbatch(run.job_json)
    record_submission(run, job_id, "slurm")
    fake.start(job_id, "n[1-2]")
    beat = Heartbeat(run.heartbeat / f"{job_id}-1", rank=0, host="n1", clock=lambda: time.time() - 42.0)
    beat.flush()
    idle = RunDir.of(load_job(LOCAL_JOB, [f"run.root={root}", "run.name=idle"]))
    idle.write_job(load_job(LOCAL_JOB, [f"run.root={root}", "run.name=idle"]))
    ended = RunDir.of(load_job(LOCAL_JOB, [f"run.root={root}", "run.name=ended", "train.steps=10"]))
    ended.write_job(load_job(LOCAL_JOB, [f"run.root={root}", "run.name=ended", "train.steps=10"]))
    ended.metrics.write_text((root / "gpt-tiny-local" / "metrics.jsonl").read_text())
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    record_submission(ended, dead.stdout.strip(), "local")
    return fake


def test_phase_folds_slurm_states() -> None:
    assert [phase(s) for s in (None, JobState.REQUEUED, JobState.COMPLETING, JobState.NODE_FAIL)] == [
        "not_submitted",
        "pending",
        "running",
        "failed",
    ]
    assert phase(JobState.UNKNOWN) == "unknown" and phase(JobState.CANCELLED) == "cancelled"


def test_textfile_of_a_fleet(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    fake = fleet(root)
    out = tmp_path / "textfile" / "air_hpc.prom"
    result = CliRunner().invoke(
        cli,
        ["metrics", "--root", str(root), "--textfile", str(out)],
        obj={"slurm_client": fake},
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.parent.iterdir()) == ["air_hpc.prom"]  # the temporary file was renamed
    got = samples(out.read_text())
    run = (("run", "gpt-tiny-local"),)
    assert got[("air_hpc_run_step", run)] == 10 and got[("air_hpc_run_total_steps", run)] == 20
    assert got[("air_hpc_run_loss", run)] == pytest.approx(4.0)
    assert got[("air_hpc_run_tokens_per_second", run)] == pytest.approx(1007.0)  # median of the last 10 rows
    assert got[("air_hpc_run_goodput_ratio", run)] == pytest.approx(10.0 / 38.5)
    assert got[("air_hpc_run_restarts_total", run)] == 1
    assert time.time() - 1038.5 - got[("air_hpc_run_checkpoint_age_seconds", run)] < 60
    assert 42 <= got[("air_hpc_run_heartbeat_age_seconds", run)] < 100
    assert got[("air_hpc_run_state", (*run, ("state", "running")))] == 1
    assert got[("air_hpc_run_state", (*run, ("state", "pending")))] == 0
    assert got[("air_hpc_run_state", (("run", "idle"), ("state", "not_submitted")))] == 1
    assert ("air_hpc_run_step", (("run", "idle"),)) not in got  # no step yet: left out, not 0
    assert got[("air_hpc_run_state", (("run", "ended"), ("state", "completed")))] == 1
    info = {dict(labels)["run"]: dict(labels) for name, labels in got if name == "air_hpc_run_info"}
    assert info["gpt-tiny-local"]["slurm_state"] == "RUNNING" and info["gpt-tiny-local"]["executor"] == "slurm"
    assert [c[0] for c in fake.calls] == ["sbatch", "squeue"]  # one squeue for the whole fleet, no sacct


def test_controller_down_leaves_the_state_unknown_and_the_rest(tmp_path: Path) -> None:
    fake = fleet(tmp_path)
    fake.reachable = False
    result = CliRunner().invoke(
        cli, ["metrics", "--root", str(tmp_path), "--textfile", str(tmp_path / "m.prom")], obj={"slurm_client": fake}
    )
    assert result.exit_code == 0, result.output
    got = samples((tmp_path / "m.prom").read_text())
    assert got[("air_hpc_run_state", (("run", "gpt-tiny-local"), ("state", "unknown")))] == 1
    assert got[("air_hpc_run_step", (("run", "gpt-tiny-local"),))] == 10


def test_an_unreadable_run_is_exported_as_such_beside_the_rest(tmp_path: Path) -> None:
    fake = fleet(tmp_path)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "job.json").write_text("")
    result = CliRunner().invoke(
        cli, ["metrics", "--root", str(tmp_path), "--textfile", str(tmp_path / "m.prom")], obj={"slurm_client": fake}
    )
    assert result.exit_code == 0, result.output
    got = samples((tmp_path / "m.prom").read_text())
    assert got[("air_hpc_run_state", (("run", "broken"), ("state", "unreadable")))] == 1
    assert got[("air_hpc_run_state", (("run", "broken"), ("state", "unknown")))] == 0
    info = {dict(labels)["run"]: dict(labels) for name, labels in got if name == "air_hpc_run_info"}
    assert "cannot read resolved config" in info["broken"]["problem"] and info["idle"]["problem"] == ""
    assert got[("air_hpc_run_state", (("run", "gpt-tiny-local"), ("state", "running")))] == 1
    assert got[("air_hpc_run_step", (("run", "gpt-tiny-local"),))] == 10


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--textfile", "out.txt"], "reads only *.prom files"),
        ([], "give one of --textfile OUT.prom or --serve PORT"),
        (["--textfile", "a.prom", "--serve", "0"], "give one of"),
    ],
)
def test_metrics_usage_errors_exit_2(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["metrics", "--root", "/nonexistent", *args])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("mode", [["--textfile", "x.prom"], ["--serve", "0"]])
def test_a_root_that_does_not_exist_is_an_error_not_an_empty_export(tmp_path: Path, mode: list[str]) -> None:
    args = [sys.executable, "-m", "air_hpc", "metrics", "--root", str(tmp_path / "nonexistent"), *mode]
    with subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise AssertionError("metrics went on exporting a root that does not exist") from None
    assert proc.returncode == 2 and out == "" and err.count("\n") == 1, err
    assert f"runs root {tmp_path / 'nonexistent'} (--root): no such directory" in err
    assert not (tmp_path / "x.prom").exists()


def test_a_port_in_use_or_an_unwritable_textfile_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit) as info:
            main(["metrics", "--root", str(tmp_path), "--serve", str(port)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"--serve {port} --bind 127.0.0.1: cannot listen there: Address already in use" in err
    assert err.count("\n") == 1
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as info:
        main(["metrics", "--root", str(tmp_path), "--textfile", str(tmp_path / "file" / "m.prom")])
    assert info.value.code == 2
    assert "cannot write" in capsys.readouterr().err


def test_endpoint_answers_openmetrics_over_loopback(tmp_path: Path) -> None:
    fake = fleet(tmp_path)
    host, port, stop = serve(registry_of(lambda: snapshot(tmp_path, fake)), 0)
    try:
        assert host == "127.0.0.1"
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.headers["Content-Type"].startswith("application/openmetrics-text")
            text = answer.read().decode()
        assert text.endswith("# EOF\n")
        got = samples(text, parse_openmetrics)
        assert got[("air_hpc_run_step", (("run", "gpt-tiny-local"),))] == 10
        assert got[("air_hpc_run_restarts_total", (("run", "gpt-tiny-local"),))] == 1
        fake.finish(next(iter(fake.jobs)))  # the next scrape reads the runs afresh
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            classic = samples(answer.read().decode())
        assert classic[("air_hpc_run_state", (("run", "gpt-tiny-local"), ("state", "completed")))] == 1
    finally:
        stop()


def test_serve_command_until_ctrl_c(tmp_path: Path) -> None:
    """The real command in its own process: serves on loopback, answers a scrape, stops cleanly on SIGINT."""
    run = RunDir.of(load_job(LOCAL_JOB, [f"run.root={tmp_path}", "run.name=solo"]))
    run.write_job(load_job(LOCAL_JOB, [f"run.root={tmp_path}", "run.name=solo"]))
    run.metrics.write_text(json.dumps({"step": 3, "loss": 2.5, "tokens_per_s": 10.0, "step_time_s": 1.0}) + "\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "air_hpc", "metrics", "--root", str(tmp_path), "--serve", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("serving http://127.0.0.1:"), first + (proc.stderr.read() if proc.stderr else "")
        url = first.split()[1]
        with urllib.request.urlopen(url, timeout=10) as answer:
            got = samples(answer.read().decode())
        assert got[("air_hpc_run_step", (("run", "solo"),))] == 3
        assert got[("air_hpc_run_loss", (("run", "solo"),))] == 2.5
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0 and "stopped" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
