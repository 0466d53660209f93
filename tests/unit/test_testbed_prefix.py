"""``testbed up --slurm-prefix``: a Slurm build is checked at the edge, and the client runs its commands."""

import json
import os
import stat
from pathlib import Path

import pytest

from air_hpc.cli.main import main
from air_hpc.errors import UserError
from air_hpc.slurm.client import SlurmClient
from air_hpc.slurm.version import SlurmVersion, is_known
from air_hpc.testbed import Testbed
from air_hpc.testbed.prefix import REQUIRED, check_prefix


def _script(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _prefix(root: Path, version_line: str, leave_out: str = "") -> Path:
    """An installed tree's layout whose slurmctld answers ``-V`` with ``version_line`` (the rest never runs)."""
    for name in REQUIRED:
        if name != leave_out:
            _script(root / name, "exit 1")
    if leave_out != "sbin/slurmctld":
        _script(root / "sbin" / "slurmctld", f'[ "$1" = -V ] && echo "{version_line}"')
    return root


def test_a_build_of_a_known_release(tmp_path: Path) -> None:
    build = check_prefix(_prefix(tmp_path / "p", "slurm 25.05.8"))
    assert build.version == SlurmVersion(25, 5, 8) and build.prefix == (tmp_path / "p").resolve()
    assert build.daemon("slurmd") == str(build.prefix / "sbin" / "slurmd")
    assert build.search_path("/usr/bin:/bin").split(":")[:3] == [str(build.bin_dir), f"{build.prefix}/sbin", "/usr/bin"]


@pytest.mark.parametrize(
    ("leave_out", "version_line", "message"),
    [
        ("sbin/slurmctld", "", r"missing sbin/slurmctld; expected a Slurm installed with `make install`"),
        ("bin/sbatch", "slurm 25.05.8", r"missing bin/sbatch;"),
        ("", "slurm 21.08.8", r"Slurm 21\.08\.8 is not a release air-hpc knows \(22\.05, .*, 26\.05\)"),
        ("", "slurm 26.11.0", r"Slurm 26\.11\.0 is not a release air-hpc knows"),
        ("", "something else", r"cannot read a Slurm version from 'something else'"),
    ],
)
def test_bad_prefix_is_a_usage_error_naming_what_is_wrong(
    tmp_path: Path, leave_out: str, version_line: str, message: str
) -> None:
    prefix = _prefix(tmp_path / "p", version_line, leave_out)
    with pytest.raises(UserError, match=rf"^--slurm-prefix {prefix}: .*{message}") as info:
        check_prefix(prefix)
    assert info.value.exit_code == 2


def test_cli_refuses_a_prefix_without_slurmctld_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = _prefix(tmp_path / "p", "", leave_out="sbin/slurmctld")
    state = tmp_path / "state"
    with pytest.raises(SystemExit) as info:
        main(["testbed", "up", "--state-dir", str(state), "--slurm-prefix", str(prefix)])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and "missing sbin/slurmctld" in err
    assert not (state / "testbed.json").exists()


def test_known_releases() -> None:
    assert is_known(SlurmVersion(22, 5, 8)) and is_known(SlurmVersion(26, 5, 3)) and is_known(SlurmVersion(23, 2, 1))
    assert not is_known(SlurmVersion(23, 5)) and not is_known(SlurmVersion(27, 5))


def test_client_runs_the_commands_of_its_bin_dir(tmp_path: Path) -> None:
    _script(tmp_path / "bin" / "scontrol", 'echo "slurm 25.05.8 from $0"')
    client = SlurmClient(env={"PATH": os.environ["PATH"]}, bin_dir=tmp_path / "bin")
    assert client.env["PATH"].startswith(f"{tmp_path / 'bin'}:")
    assert client.run(["scontrol", "--version"]).stdout.strip() == f"slurm 25.05.8 from {tmp_path / 'bin' / 'scontrol'}"
    assert client.version() == SlurmVersion(25, 5, 8)


def test_testbed_of_a_build_puts_its_commands_first(tmp_path: Path) -> None:
    """What ``testbed env`` exports and the testbed's client runs follow the build recorded at ``up``."""
    bed = Testbed(tmp_path)
    bed.layout.root.mkdir(parents=True, exist_ok=True)
    assert bed.build is None and set(bed.env) == {"SLURM_CONF"}
    state = {"slurm_prefix": "/opt/slurm/25.05.8", "slurm_version": "25.05.8", "daemons": []}
    bed.layout.state_json.write_text(json.dumps(state))
    assert bed.build is not None and bed.build.version == SlurmVersion(25, 5, 8)
    assert bed.env["PATH"].startswith("/opt/slurm/25.05.8/bin:/opt/slurm/25.05.8/sbin:")
    assert bed.client().env["PATH"].startswith("/opt/slurm/25.05.8/bin:")
