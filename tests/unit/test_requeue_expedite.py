"""``--requeue=expedite`` where the controller offers it (25.11 and later, with
``SlurmctldParameters=enable_expedited_requeue``, without which slurmctld refuses the job), ``--requeue`` elsewhere.

Goldens per release (``tests/data/golden/requeue/``; regenerate with ``AIR_HPC_UPDATE_GOLDEN=1`` and review
the diff), rendered for a controller that allows it: the scripts differ in that one line. The release comes
from the cluster profile, else ``scontrol --version``.
"""

import difflib
import os
from pathlib import Path

import pytest

from air_hpc.config import load_job
from air_hpc.launch.executors import submitit_options
from air_hpc.launch.plan import plan
from air_hpc.render import build_spec, render_script
from air_hpc.render.directives import slurm_directives
from air_hpc.slurm.fake import FakeSlurm
from air_hpc.slurm.version import SlurmVersion

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "data" / "golden" / "requeue"
TESTBED_JOB = REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml"
FIXED = ["run.root=/shared/runs", "data.path=/shared/data/corpus.h5", "cluster.python=/shared/air-hpc/bin/python"]
RELEASES = {"25.05": SlurmVersion(25, 5, 8), "25.11": SlurmVersion(25, 11, 0), "26.05": SlurmVersion(26, 5, 3)}


def rendered(version: SlurmVersion | None) -> str:
    job = load_job(TESTBED_JOB, FIXED)
    return render_script(build_spec(job, python="/opt/air-hpc/bin/python", slurm_version=version, expedite=True))


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_the_script_of_each_release_matches_its_golden(release: str) -> None:
    text = rendered(RELEASES[release])
    path = GOLDEN / f"gpt-tiny-testbed-{release}.sbatch"
    if os.environ.get("AIR_HPC_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


def test_only_the_requeue_line_changes_and_an_unknown_release_gets_the_plain_flag() -> None:
    old, new = rendered(RELEASES["25.05"]), rendered(RELEASES["25.11"])
    changed = [line for line in difflib.ndiff(old.splitlines(), new.splitlines()) if line[:1] in "+-"]
    assert changed == ["- #SBATCH --requeue", "+ #SBATCH --requeue=expedite"]
    assert rendered(None) == old and rendered(SlurmVersion(25, 11, 0)) == rendered(RELEASES["26.05"])


def test_submit_asks_the_release_and_the_setting_and_submitit_gets_the_same_option(tmp_path: Path) -> None:
    fake = FakeSlurm()
    fake.version_line = "slurm 25.11.2"
    job = load_job(TESTBED_JOB, [f"run.root={tmp_path}", "data.path=/shared/data/corpus.h5"])
    assert "#SBATCH --requeue\n" in plan(job, fake).script  # 25.11 without enable_expedited_requeue
    fake.slurmctld_parameters = "enable_expedited_requeue"
    assert "#SBATCH --requeue=expedite\n" in plan(job, fake).script
    fake.version_line = "slurm 25.05.8"
    calls = len(fake.calls)
    assert "#SBATCH --requeue\n" in plan(job, fake).script
    assert fake.calls[calls:] == [["scontrol", "--version"]]  # before 25.11 the setting is not even asked
    options = submitit_options(slurm_directives(job, version=SlurmVersion(25, 11), expedite=True))
    assert options["additional_parameters"]["requeue"] == "expedite"
    pinned = load_job(TESTBED_JOB, [f"run.root={tmp_path}", "cluster.slurm_version=26.05.3"])
    assert "#SBATCH --requeue\n" in plan(pinned, None).script  # render asks no Slurm: the setting is unknown
