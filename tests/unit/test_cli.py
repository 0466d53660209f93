"""CLI exit codes and the error boundary, through click's runner and a real subprocess."""

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import RunMain

REPO = Path(__file__).resolve().parents[2]
TESTBED_JOB = str(REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml")


def test_config_show_json_with_override(run_main: RunMain) -> None:
    code, out, _ = run_main(["config", "show", TESTBED_JOB, "--set", "train.steps=7", "--json"])
    assert code == 0
    data = json.loads(out)
    assert data["train"]["steps"] == 7
    assert data["derived"]["layout"] == {"tp": 2, "pp": 2, "dp": 1, "vpp": None}


def test_misspelt_key_exits_2_with_one_line(tmp_path: Path, run_main: RunMain) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(Path(TESTBED_JOB).read_text().replace("  steps:", "  stpes:"))
    code, out, err = run_main(["config", "show", str(bad)])
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert "train.stpes" in err and "did you mean 'train.steps'" in err


def test_render_of_a_run_name_with_a_backslash_exits_2_with_one_line(run_main: RunMain) -> None:
    code, out, err = run_main(["render", TESTBED_JOB, "--set", "run.name=team\\lab", "--set", "run.root=/shared/runs"])
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and "run.name: 'team\\\\lab' holds a backslash" in err


def test_unknown_command_exits_2(run_main: RunMain) -> None:
    code, _, err = run_main(["confg"])
    assert code == 2
    assert "No such command" in err


def test_version(run_main: RunMain) -> None:
    code, out, _ = run_main(["--version"])
    assert code == 0 and "air-hpc" in out


def test_help_does_not_import_torch_megatron_or_tensorboard() -> None:
    probe = (
        "import sys; from air_hpc.cli.main import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = ('torch', 'megatron', 'tensorboard', 'prometheus_client')\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in heavy]\n"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_registered_command_imports_without_torch() -> None:
    probe = (
        "import sys; from air_hpc.cli.main import COMMANDS, cli\n"
        "import click\n"
        "ctx = click.Context(cli)\n"
        "for name in COMMANDS:\n    cli.get_command(ctx, name)\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron', 'tensorboard')]\n"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_readme_exit_code_table_is_exitcodes_py() -> None:
    from air_hpc.exitcodes import ExitCode

    readme = (REPO / "README.md").read_text()
    table = readme[readme.index("| code | name | meaning |") :].split("\n\n")[0].splitlines()[2:]
    rows = [tuple(cell.strip() for cell in line.strip("|").split("|")[:2]) for line in table]
    assert rows == [(str(int(code)), code.name) for code in ExitCode]


def test_shell_completion_script_without_torch() -> None:
    probe = (
        "import sys; from air_hpc.cli.main import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron')]\n"
        "sys.exit(1 if bad else 0)"
    )
    env = {**os.environ, "_AIR_HPC_COMPLETE": "bash_source"}
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, env=env)
    assert result.returncode == 0, result.stderr
    assert "_air_hpc_completion()" in result.stdout and "complete -o nosort -F _air_hpc_completion" in result.stdout
