"""The version matrix: a testbed from each Slurm build in ``AIR_HPC_SLURM_PREFIXES`` (``:``-separated prefixes of
``scripts/slurm-build.sh``), its version shown, every parser run on what it prints, and a dry run it accepts.

Skipped when the variable is unset: CI runs Debian's 22.05 alone (the rest of tests/integration/). The behaviour
tests proper (submit, preemption, requeue, spares, placement) run on a build with ``scripts/slurm-matrix.sh``.
"""

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from air_hpc.slurm.version import parse_version
from air_hpc.testbed import Testbed
from tests.unit import test_slurm_fixtures as fixtures

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
AIR_HPC = str(REPO / ".venv" / "bin" / "air-hpc")
PREFIXES = [p for p in os.environ.get("AIR_HPC_SLURM_PREFIXES", "").split(":") if p]
SKIP = "AIR_HPC_SLURM_PREFIXES is unset: no Slurm builds to test (scripts/slurm-build.sh SOURCE PREFIX)"


PARAMS: list[object] = [*PREFIXES] or [pytest.param(None, marks=pytest.mark.skip(reason=SKIP))]


@pytest.fixture(scope="module", params=PARAMS, ids=lambda p: str(p).rsplit("/", 1)[-1])
def build_bed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    bed = Testbed(tmp_path_factory.mktemp("matrix"))
    bed.up((2, 4, 2), slurm_prefix=Path(request.param))
    try:
        yield bed
    finally:
        bed.down()


def _cli(bed: Testbed, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it after ``eval "$(air-hpc testbed env)"``."""
    env = {**os.environ, **bed.env}
    return subprocess.run([AIR_HPC, *args], capture_output=True, text=True, env=env, timeout=300, check=False)


def test_every_command_and_daemon_is_the_builds(build_bed: Testbed) -> None:
    build = build_bed.build
    assert build is not None
    state_dir = str(build_bed.layout.root)
    status = json.loads(_cli(build_bed, "testbed", "status", "--state-dir", state_dir, "--json").stdout)
    assert (status["slurm_version"], status["slurm_prefix"]) == (str(build.version), str(build.prefix))
    assert build_bed.client().version() == build.version
    assert status["up"] and status["nodes"] == {f"n{i}": "idle" for i in range(1, 9)}
    exported = _cli(build_bed, "testbed", "env", "--state-dir", state_dir).stdout
    assert f"export PATH={build.prefix}/bin:{build.prefix}/sbin:" in exported
    doctor = _cli(build_bed, "doctor")
    assert doctor.returncode == 0, doctor.stderr
    assert f"Slurm {build.version}," in doctor.stdout


def test_every_parser_reads_what_the_build_prints(build_bed: Testbed, tmp_path: Path) -> None:
    build = build_bed.build
    assert build is not None
    capture = subprocess.run(
        [str(REPO / "scripts" / "slurm-capture.sh"), str(build_bed.layout.root), str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}"},
        timeout=300,
        check=False,
    )
    assert capture.returncode == 0, capture.stderr
    release = tmp_path / str(build.version)
    assert parse_version((release / "sbatch-version.out").read_text()) == build.version
    for check in (
        fixtures.test_version_of_every_command_is_the_directory_release,
        fixtures.test_test_only_reply_and_refusal,
        fixtures.test_squeue_keeps_names_states_and_reasons,
        fixtures.test_scontrol_show_job,
        fixtures.test_sacct_records_every_run,
        fixtures.test_node_states_and_groups,
        fixtures.test_partitions_config_and_topology,
    ):
        check(release)


def test_dry_run_is_accepted(build_bed: Testbed, tmp_path: Path, small_corpus: Path) -> None:
    job = str(REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml")
    sets = ["--set", f"run.root={tmp_path}", "--set", f"data.path={small_corpus}"]
    done = _cli(build_bed, "submit", "--dry-run", job, *sets)
    assert done.returncode == 0, done.stderr
    assert "dry run: sbatch --test-only: would start" in done.stderr
