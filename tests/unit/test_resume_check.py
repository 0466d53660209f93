"""A job that cannot resume its run directory's checkpoints is refused at submit; a layout change resumes (issue 24.1).

The run directory is real (its job record written by ``RunDir.write_job``, checkpoints committed by the
real ``CheckpointStore``); only Slurm is the fake controller.
"""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from air_hpc.cli.main import cli, main
from air_hpc.config import load_job
from air_hpc.errors import ConfigError
from air_hpc.launch.resume import changes, check_resume
from air_hpc.launch.submit import submit
from air_hpc.records.rundir import RunDir
from air_hpc.resilience.store import CheckpointStore
from air_hpc.slurm.fake import FakeSlurm
from air_hpc.train import data

REPO = Path(__file__).resolve().parents[2]
TESTBED_JOB = REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml"


@pytest.fixture
def job_args(tmp_path: Path, small_corpus: Path) -> list[str]:
    return [f"run.root={tmp_path / 'runs'}", f"data.path={small_corpus}", "train.steps=20"]


def trained(job_args: list[str], step: int = 10) -> RunDir:
    """The run directory of gpt-tiny after a start that saved ``step``."""
    job = load_job(TESTBED_JOB, job_args)
    run = RunDir.of(job)
    run.write_job(job)
    store = CheckpointStore(run.checkpoints, keep_last=3)
    staging = store.begin(step)
    (staging / "common.pt").write_bytes(b"x" * 10)
    store.commit(step)
    return run


def cli_submit(job_args: list[str], *extra: str) -> tuple[Result, FakeSlurm]:
    fake = FakeSlurm()
    sets = [arg for pair in (("--set", a) for a in job_args) for arg in pair]
    result = CliRunner().invoke(cli, ["submit", str(TESTBED_JOB), *sets, *extra], obj={"slurm_client": fake})
    return result, fake


def test_a_changed_model_is_refused_naming_the_keys_and_both_ways_out(job_args: list[str]) -> None:
    run = trained(job_args)
    changed = [*job_args, "model.hidden_size=128", "model.num_layers=2"]
    with pytest.raises(ConfigError) as refused:
        check_resume(load_job(TESTBED_JOB, changed))
    message = str(refused.value)
    assert "model.hidden_size 64 -> 128" in message and "model.num_layers" in message
    assert "up to step 10" in message and str(run.job_json) in message
    assert "run.name" in message and "--fresh" in message
    for extra in ((), ("--dry-run",)):
        result, fake = cli_submit(changed, *extra)
        assert isinstance(result.exception, ConfigError) and "model.hidden_size 64 -> 128" in str(result.exception)
        assert fake.calls == []
    assert json.loads(run.job_json.read_text())["model"]["hidden_size"] == 64  # the record is untouched


def test_the_refusal_is_one_line_and_exit_2(job_args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    trained(job_args)
    sets = [arg for pair in (("--set", a) for a in [*job_args, "model.hidden_size=128"]) for arg in pair]
    with pytest.raises(SystemExit) as exited:
        main(["submit", str(TESTBED_JOB), *sets, "--dry-run"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1 and err.startswith("error: ") and "--fresh" in err


def test_a_changed_vocabulary_or_sequence_is_refused_but_not_a_changed_name_or_dropout(job_args: list[str]) -> None:
    trained(job_args)
    for key in ("model.vocab_size=1024", "model.seq_len=32", "model.ffn_hidden_size=512"):
        with pytest.raises(ConfigError, match=key.replace("=", " [0-9]+ -> ")):
            check_resume(load_job(TESTBED_JOB, [*job_args, key]))
    same_shapes = load_job(TESTBED_JOB, [*job_args, "model.dropout=0.1", "model.name=tiny-copy", "train.lr=1e-3"])
    check = check_resume(same_shapes)
    assert check is not None and check.blocking == () and check.note() is None


def test_an_unset_mlp_width_is_four_times_the_hidden_size() -> None:
    recorded = {"model": {"hidden_size": 64, "ffn_hidden_size": None}}
    assert list(changes(recorded, {"model": {"hidden_size": 64, "ffn_hidden_size": 256}})) == []
    (change,) = changes(recorded, {"model": {"hidden_size": 64, "ffn_hidden_size": 512}})
    assert str(change) == "model.ffn_hidden_size 256 -> 512"


def test_a_layout_change_resumes_and_is_said(job_args: list[str]) -> None:
    trained(job_args)
    layout = [*job_args, "parallel.tp=1", "parallel.pp=1", "resources.nodes=1", "resources.tasks_per_node=2"]
    check = check_resume(load_job(TESTBED_JOB, layout))
    assert check is not None and check.step == 10
    assert "parallel.tp 2 -> 1" in (check.note() or "") and "resources.nodes 2 -> 1" in (check.note() or "")
    result, fake = cli_submit(layout)
    assert result.exit_code == 0, result.output
    assert "note: resuming" in result.output and "resharded" in result.output
    assert any(call[:2] == ["sbatch", "--parsable"] for call in fake.calls)


def test_a_different_tokenizer_is_refused(job_args: list[str], tmp_path: Path) -> None:
    trained(job_args)

    class OtherBytes(data.ByteTokenizer):
        name = "other-bytes"

    other = data.prepare([REPO / "README.md"], tmp_path / "other.h5", OtherBytes()).path
    with pytest.raises(ConfigError, match=r"data.path \(tokenizer\) byte -> other-bytes"):
        check_resume(load_job(TESTBED_JOB, [*job_args, f"data.path={other}"]))
    same = data.prepare([REPO / "README.md"], tmp_path / "same.h5", data.ByteTokenizer()).path
    assert check_resume(load_job(TESTBED_JOB, [*job_args, f"data.path={same}"])) is not None


def test_fresh_moves_the_old_run_aside_and_submits(job_args: list[str]) -> None:
    run = trained(job_args)
    changed = load_job(TESTBED_JOB, [*job_args, "model.hidden_size=128"])
    fake = FakeSlurm()
    done = submit(changed, "slurm", fake, fresh=True)
    assert done.set_aside is not None and done.set_aside.name.startswith(f"{run.path.name}.replaced-")
    assert CheckpointStore(RunDir(done.set_aside).checkpoints, 3).committed_steps() == [10]  # nothing deleted
    assert json.loads(RunDir(done.set_aside).job_json.read_text())["model"]["hidden_size"] == 64
    assert CheckpointStore(run.checkpoints, 3).committed_steps() == []
    assert json.loads(run.job_json.read_text())["model"]["hidden_size"] == 128
    assert check_resume(changed) is None  # no checkpoints: nothing to compare


def test_fresh_on_the_cli_says_where_the_old_run_went(job_args: list[str]) -> None:
    run = trained(job_args)
    changed = [*job_args, "model.hidden_size=128"]
    dry, _ = cli_submit(changed, "--fresh", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert f"--fresh would move {run.path} aside" in dry.output and run.job_json.exists()
    result, _ = cli_submit(changed, "--fresh")
    assert result.exit_code == 0, result.output
    assert "moved the previous run directory aside to" in result.output
    assert len(list(run.path.parent.glob(f"{run.path.name}.replaced-*"))) == 1
