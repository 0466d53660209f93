"""Slurm's release as a value: ``--version`` output of 22.05 through 26.05, Debian's ``slurm-wlm`` included."""

from pathlib import Path

import pytest

from air_hpc.errors import SlurmError
from air_hpc.slurm.jobs import SLURM_REQUEUES_PREEMPTED_FROM, parse_preemption, slurm_epoch
from air_hpc.slurm.version import SlurmVersion, parse_version

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
#: ``--version`` output captured from real builds (scripts/slurm-capture.sh), one directory per release.
CAPTURED = sorted([*DATA.glob("*/scontrol-version.out"), *DATA.glob("*/sbatch-version.out")])


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("slurm 22.05.8\n", SlurmVersion(22, 5, 8)),
        ("slurm-wlm 22.05.8\n", SlurmVersion(22, 5, 8)),  # Debian 12's packages (the testbed)
        ("slurm-wlm 24.11.5\n", SlurmVersion(24, 11, 5)),  # Debian 13
        ("slurm 25.05.8\n", SlurmVersion(25, 5, 8)),
        ("slurm 25.11.0-0rc1\n", SlurmVersion(25, 11, 0)),
        ("slurm 26.05.0\n", SlurmVersion(26, 5, 0)),
    ],
)
def test_version_lines_of_every_release(text: str, version: SlurmVersion) -> None:
    assert parse_version(text) == version


@pytest.mark.parametrize("path", CAPTURED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_captured_version_output_names_its_release(path: Path) -> None:
    version = parse_version(path.read_text(), str(path))
    assert f"{version.major:02d}.{version.minor:02d}" in path.parent.name


def test_releases_order_as_slurm_numbers_them() -> None:
    releases = ["26.05.0", "22.05.8", "25.05.8", "24.11.5", "25.05.10", "23.02.1", "25.11.0"]
    ordered = sorted(parse_version(f"slurm {r}") for r in releases)
    assert [str(v) for v in ordered] == ["22.05.8", "23.02.1", "24.11.5", "25.05.8", "25.05.10", "25.11.0", "26.05.0"]
    assert SlurmVersion(24, 5) <= SlurmVersion(24, 5, 0) < SlurmVersion(24, 11, 5)


@pytest.mark.parametrize("text", ["", "scontrol: fatal: Could not establish a configuration source\n", "slurm\n"])
def test_no_version_is_one_error_quoting_what_was_printed(text: str) -> None:
    with pytest.raises(SlurmError, match=r"^scontrol --version: cannot read a Slurm version from"):
        parse_version(text)


def test_preemption_from_scontrol_fields() -> None:
    fields = {"PreemptTime": "2026-12-03T07:00:00", "EndTime": "2026-12-03T07:00:30"}
    now = slurm_epoch(fields["PreemptTime"]) or 0  # Slurm's times are local
    fit = parse_preemption(fields, SlurmVersion(22, 5, 8), now + 10)
    late = parse_preemption(fields, SLURM_REQUEUES_PREEMPTED_FROM, now + 40)
    assert fit is not None and (fit.grace_s, fit.ended_after_s, fit.fit, fit.requeue_by) == (30, 10, True, "batch")
    assert late is not None and (late.fit, late.requeue_by) == (False, "slurm")
    unknown = parse_preemption(fields, None, now)
    assert unknown is not None and unknown.requeue_by == "batch"
    assert parse_preemption({"PreemptTime": "None", "EndTime": "2026-12-03T07:00:30"}, SlurmVersion(25, 5), now) is None
