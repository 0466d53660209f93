"""Job files outside the checkout (issue 24 item 4): preset jobs by name, relative paths of an installed
package's presets, the resolved run directory said, ``python -m air_hpc.cli.main`` as an entry point."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from air_hpc.cli.main import cli
from air_hpc.config import load, load_job
from air_hpc.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_a_preset_job_is_taken_by_name() -> None:
    by_name = load_job("gpt-tiny-testbed", ["train.steps=7"])
    by_path = load_job(REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml", ["train.steps=7"])
    assert by_name == by_path


def test_an_unknown_name_lists_the_preset_jobs() -> None:
    with pytest.raises(ConfigError) as refused:
        load_job("gpt-tiny-testbd")
    message = str(refused.value)
    assert message.startswith("gpt-tiny-testbd: no such file, nor a preset job of that name")
    assert "did you mean 'gpt-tiny-testbed'?" in message and "gpt-tiny-local, gpt-tiny-testbed" in message
    with pytest.raises(ConfigError, match=r"missing.yaml: no such file$"):
        load_job("missing.yaml")  # a file name is a file, never a preset


def test_render_takes_a_preset_name_and_says_the_run_directory(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["render", "gpt-tiny-testbed", "--set", f"run.root={tmp_path}"])
    assert result.exit_code == 0, result.output
    assert f"#SBATCH --chdir={tmp_path / 'gpt-tiny-testbed'}" in result.stdout
    assert result.stderr == f"run dir {tmp_path / 'gpt-tiny-testbed'}\n"


def test_a_copied_job_file_resolves_against_its_folder_and_says_so(tmp_path: Path) -> None:
    jobs = tmp_path / "home" / "me" / "jobs"
    jobs.mkdir(parents=True)
    copy = jobs / "real.yaml"
    shutil.copy(REPO / "configs" / "jobs" / "gpt-tiny-local.yaml", copy)
    result = CliRunner().invoke(cli, ["render", str(copy)])
    assert result.exit_code == 0, result.output
    assert result.stderr == f"run dir {tmp_path / 'home' / 'runs' / 'gpt-tiny-local'}\n"


def test_an_installed_packages_presets_take_relative_paths_from_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "site-packages" / "air_hpc"
    shutil.copytree(REPO / "configs", package / "presets")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setattr(load, "PRESETS_DIR", (package / "presets").resolve())
    monkeypatch.setattr(load, "PRESETS_INSTALLED", True)  # a wheel's own copy (test_wheel.py installs a real one)
    job = load_job("gpt-tiny-local")
    assert job.run.dir == work / "runs" / "gpt-tiny-local"
    assert job.data.path == work / "runs" / "data" / "corpus.h5"
    monkeypatch.setattr(load, "PRESETS_INSTALLED", False)  # a checkout: relative to the preset's folder
    assert load_job("gpt-tiny-local").run.dir == package / "runs" / "gpt-tiny-local"


def test_python_m_air_hpc_cli_main_runs_the_cli(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "air_hpc.cli.main", "render", "gpt-tiny-testbed", "--set", f"run.root={tmp_path}"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("#!") and f"run dir {tmp_path / 'gpt-tiny-testbed'}" in done.stderr


def test_python_m_on_a_command_module_says_it_is_not_an_entry_point() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "air_hpc.cli.job_cmds", "render", "gpt-tiny-testbed"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "error: air_hpc.cli.job_cmds is not an entry point; run `air-hpc ...`, `python -m air_hpc ...` "
        "or `python -m air_hpc.cli.main ...`\n"
    )


def test_a_preset_name_finds_its_run_outside_the_runs_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from air_hpc.errors import UserError
    from air_hpc.ops.runs import resolve_run
    from air_hpc.records.rundir import RunDir

    shutil.copytree(REPO / "configs", tmp_path / "configs")
    monkeypatch.setattr(load, "PRESETS_DIR", tmp_path / "configs")
    elsewhere = tmp_path / "elsewhere"
    with pytest.raises(UserError, match="no such run"):
        resolve_run("gpt-tiny-local", root=elsewhere)  # the preset has not run yet
    job = load_job("gpt-tiny-local")
    RunDir.of(job).write_job(job)
    assert resolve_run("gpt-tiny-local", root=elsewhere) == RunDir(tmp_path / "runs" / "gpt-tiny-local")
