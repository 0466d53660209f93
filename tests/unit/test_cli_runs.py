"""Run handles (one resolver for directory, name and job file), ``air-hpc runs``, ``logs`` and ``--json``."""

import json
from pathlib import Path

import pytest

from air_hpc.cli.main import cli
from air_hpc.ops.runs import RUNS_ROOT_ENV, resolve_run
from air_hpc.ops.states import snapshot
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import record_submission
from air_hpc.slurm.fake import FakeSlurm
from air_hpc.slurm.jobs import JobState
from tests.conftest import RunMain
from tests.unit.test_observe_report import REPO, preempted_run


def invoke(args: list[str], fake: FakeSlurm, capsys: pytest.CaptureFixture[str]) -> str:
    cli.main(args=args, standalone_mode=False, obj={"slurm_client": fake})
    return capsys.readouterr().out


@pytest.fixture
def slurm_run(tmp_path: Path) -> tuple[RunDir, FakeSlurm, str]:
    """The preempted run of test_observe_report, submitted through our script and running on the fake."""
    run_dir = preempted_run(tmp_path / "runs")
    fake = FakeSlurm()
    job_id = fake.sbatch(run_dir.job_json)
    record_submission(run_dir, job_id, "slurm")
    fake.start(job_id, "n[1-2]")
    return run_dir, fake, job_id


def test_one_resolver_takes_a_directory_a_name_or_a_job_file(
    slurm_run: tuple[RunDir, FakeSlurm, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir, _, _ = slurm_run
    assert resolve_run(str(run_dir.path)) == run_dir
    assert resolve_run("gpt-tiny-local", root=tmp_path / "runs") == run_dir
    monkeypatch.setenv(RUNS_ROOT_ENV, str(tmp_path / "runs"))
    assert resolve_run("gpt-tiny-local") == run_dir
    job_file = tmp_path / "job.yaml"
    text = (REPO / "configs" / "jobs" / "gpt-tiny-local.yaml").read_text()
    job_file.write_text(text.replace("root: ../../runs", "root: runs"))  # relative to the job file
    assert resolve_run(str(job_file)) == run_dir


def test_an_unknown_run_suggests_the_closest_name(
    slurm_run: tuple[RunDir, FakeSlurm, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    run_main: RunMain,
) -> None:
    monkeypatch.setenv(RUNS_ROOT_ENV, str(tmp_path / "runs"))
    code, _, err = run_main(["status", "gpt-tiny-lcoal"])
    assert code == 2 and err.count("\n") == 1
    assert "no such run" in err and "did you mean 'gpt-tiny-local'?" in err


def test_status_and_cancel_by_name(
    slurm_run: tuple[RunDir, FakeSlurm, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, fake, job_id = slurm_run
    monkeypatch.setenv(RUNS_ROOT_ENV, str(tmp_path / "runs"))
    assert json.loads(invoke(["status", "gpt-tiny-local", "--json"], fake, capsys))["state"] == "RUNNING"
    out = invoke(["cancel", "gpt-tiny-local", "--json"], fake, capsys)
    assert out.startswith("{\n  ")
    assert json.loads(out) == {
        "cancelled": True,
        "cluster": None,
        "executor": "slurm",
        "job_id": job_id,
        "run_dir": str(tmp_path / "runs" / "gpt-tiny-local"),
        "state": "RUNNING",
        "detail": "",
    }
    assert ["scancel", job_id] in fake.calls


@pytest.mark.parametrize("end", [JobState.COMPLETED, JobState.FAILED])
def test_cancel_of_an_ended_job_says_so_and_cancels_nothing(
    slurm_run: tuple[RunDir, FakeSlurm, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    end: JobState,
) -> None:
    _, fake, job_id = slurm_run
    fake.finish(job_id, end)
    monkeypatch.setenv(RUNS_ROOT_ENV, str(tmp_path / "runs"))
    data = json.loads(invoke(["cancel", "gpt-tiny-local", "--json"], fake, capsys))
    assert (data["cancelled"], data["state"], data["job_id"]) == (False, str(end), job_id)
    assert invoke(["cancel", "gpt-tiny-local"], fake, capsys) == (
        f"job {job_id} (slurm) had already ended: {end}; nothing to cancel\n"
    )
    assert not [c for c in fake.calls if c[0] == "scancel"]
    assert fake.jobs[job_id].state is end
    del fake.jobs[job_id]  # forgotten by the controller and by accounting
    assert invoke(["cancel", "gpt-tiny-local"], fake, capsys) == (
        f"job {job_id} (slurm) is no longer queued or running (neither squeue nor sacct knows it); nothing to cancel\n"
    )


def test_runs_lists_every_run_under_the_root(
    slurm_run: tuple[RunDir, FakeSlurm, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, fake, job_id = slurm_run
    RunDir(tmp_path / "runs" / "fresh").write_job(RunDir(tmp_path / "runs" / "gpt-tiny-local").read_job())
    (tmp_path / "runs" / "not-a-run").mkdir()
    data = json.loads(invoke(["runs", "--root", str(tmp_path / "runs"), "--json"], fake, capsys))
    assert data["root"] == str(tmp_path / "runs")
    first, second = data["runs"]
    assert (first["name"], first["state"], first["step"], first["total_steps"], first["job_id"]) == (
        "fresh",
        "not submitted",
        None,
        20,
        None,
    )
    assert (second["name"], second["state"], second["step"], second["restarts"], second["job_id"]) == (
        "gpt-tiny-local",
        "RUNNING",
        10,
        1,
        job_id,
    )
    assert second["goodput"] == pytest.approx(10.0 / 38.5)
    assert second["loss"] == pytest.approx(4.0)
    table = invoke(["runs", "--root", str(tmp_path / "runs")], fake, capsys)
    header, fresh, row = table.splitlines()[:3]
    assert header.split() == ["run", "state", "step", "loss", "restarts", "goodput", "last", "ckpt", "job"]
    assert fresh.split() == ["fresh", "not", "submitted", "-", "-", "0", "-", "-", "-"]
    assert row.split()[:6] == ["gpt-tiny-local", "RUNNING", "10/20", "4.0000", "1", "26.0%"]
    assert row.split()[-1] == job_id


def test_runs_on_an_empty_root(tmp_path: Path, run_main: RunMain) -> None:
    code, out, _ = run_main(["runs", "--root", str(tmp_path)])
    assert code == 0 and out == f"no runs under {tmp_path}\n"


def write_logs(run_dir: RunDir, job_id: str) -> None:
    run_dir.logs.mkdir(parents=True, exist_ok=True)
    run_dir.rank_log(1).write_text("t rank=1 INFO air_hpc.train.trainer: step 1/20 lr 0.001\n")
    run_dir.rank_log(3).write_text("t rank=3 INFO air_hpc.train.trainer: step 1/20 loss 5.100000\n")
    (run_dir.logs / f"slurm-{job_id}.out").write_text("0: hello from 0\n1: hello from 1\n1: step done\n")
    (run_dir.logs / f"slurm-{job_id}.err").write_text("air-hpc: job started\n1: a warning\n")


def test_logs_of_one_rank_name_their_files(slurm_run: tuple[RunDir, FakeSlurm, str], run_main: RunMain) -> None:
    run_dir, _, job_id = slurm_run
    write_logs(run_dir, job_id)
    code, out, _ = run_main(["logs", str(run_dir.path), "--rank", "1"])
    assert code == 0
    assert out.splitlines() == [
        "==> logs/rank-1.log <==",
        "t rank=1 INFO air_hpc.train.trainer: step 1/20 lr 0.001",
        f"==> logs/slurm-{job_id}.out <==",
        "1: hello from 1",
        "1: step done",
        f"==> logs/slurm-{job_id}.err <==",
        "1: a warning",
    ]
    code, out, _ = run_main(["logs", str(run_dir.path), "--rank", "1", "--grep", "step"])
    assert out.splitlines() == [
        "==> logs/rank-1.log <==",
        "t rank=1 INFO air_hpc.train.trainer: step 1/20 lr 0.001",
        f"==> logs/slurm-{job_id}.out <==",
        "1: step done",
    ]
    code, out, _ = run_main(["logs", str(run_dir.path), "--grep", "^air-hpc", "--json"])
    assert json.loads(out)["lines"] == [{"file": f"logs/slurm-{job_id}.err", "line": "air-hpc: job started"}]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rank", "9"], "--rank 9: run gpt-tiny-local has 4 ranks (0-3)"),
        (["--grep", "("], "--grep '(': not a regular expression"),
    ],
)
def test_logs_bad_input_exits_2(
    slurm_run: tuple[RunDir, FakeSlurm, str], run_main: RunMain, args: list[str], message: str
) -> None:
    run_dir, _, job_id = slurm_run
    write_logs(run_dir, job_id)
    code, out, err = run_main(["logs", str(run_dir.path), *args])
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err


def test_usage_errors_are_json_too_when_asked(tmp_path: Path, run_main: RunMain) -> None:
    code, out, err = run_main(["runs", "--root", str(tmp_path), "--json", "--bogus"])
    assert code == 2 and err == ""
    assert json.loads(out) == {"error": "error: No such option '--bogus'.", "exit_code": 2}


def test_runs_and_the_metrics_exporter_show_the_same_numbers(
    slurm_run: tuple[RunDir, FakeSlurm, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One per-run summary feeds both; the columns they share agree."""
    _, fake, _ = slurm_run
    row = json.loads(invoke(["runs", "--root", str(tmp_path / "runs"), "--json"], fake, capsys))["runs"][0]
    (metrics,) = snapshot(tmp_path / "runs", fake)
    shared = ("name", "path", "step", "total_steps", "loss", "restarts", "goodput")
    assert {k: row[k] for k in shared} == {k: getattr(metrics.summary, k) for k in shared}
    assert row["step"] is not None and row["goodput"] is not None


@pytest.mark.parametrize("content", ["", '{"model": {"layers": "many"}}', "\x00\xff"])
def test_one_unreadable_run_is_marked_and_hides_no_other(
    slurm_run: tuple[RunDir, FakeSlurm, str], tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str
) -> None:
    _, fake, job_id = slurm_run
    broken = tmp_path / "runs" / "broken"
    broken.mkdir()
    (broken / "job.json").write_text(content, errors="surrogateescape")
    data = json.loads(invoke(["runs", "--root", str(tmp_path / "runs"), "--json"], fake, capsys))
    bad, good = data["runs"]
    assert (bad["name"], bad["state"], bad["step"]) == ("broken", "unreadable", None)
    assert str(broken / "job.json") in bad["problem"]
    assert (good["name"], good["state"], good["step"], good["job_id"], good["problem"]) == (
        "gpt-tiny-local",
        "RUNNING",
        10,
        job_id,
        None,
    )
    cli.main(args=["runs", "--root", str(tmp_path / "runs")], standalone_mode=False, obj={"slurm_client": fake})
    out, err = capsys.readouterr()
    listed = [line.split()[:2] for line in out.splitlines()[1:]]
    assert listed == [["broken", "unreadable"], ["gpt-tiny-local", "RUNNING"]]
    assert err.startswith(f"warning: run broken is unreadable: {broken / 'job.json'}") and err.count("\n") == 1
