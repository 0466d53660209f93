"""The package as a wheel: built from this checkout, installed into an empty target, used from an empty directory.

Only ``PYTHONPATH=<target>`` points at air-hpc; its dependencies come from the running
environment. Nothing is downloaded (``--no-index``, ``--no-build-isolation``).
"""

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
#: What the build reads: the package (its templates/ and presets/ link to sbatch/ and configs/) and metadata.
SOURCES = ("pyproject.toml", "README.md", "air_hpc", "sbatch", "configs")
#: Shipped package data and the checkout folder it comes from.
PACKAGE_DATA = {"templates": "sbatch", "presets": "configs"}
#: Names only presets (cluster, hardware, model); copied outside the repo.
PRESETS_ONLY_JOB = REPO / "tests" / "data" / "presets-only-job.yaml"


def write_job(directory: Path, cluster: str = "testbed") -> Path:
    path = directory / "job.yaml"
    path.write_text(PRESETS_ONLY_JOB.read_text().replace("cluster: testbed", f"cluster: {cluster}"))
    return path


def _pip(*args: str, cwd: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", *args, "--no-deps", "--no-index", "--disable-pip-version-check", "-q"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the sources (so the build leaves no build/ or egg-info here), built and installed into a target."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    src.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, src / name)
    _pip("wheel", "--no-build-isolation", "-w", str(root / "dist"), ".", cwd=src)
    (wheel,) = (root / "dist").glob("air_hpc-*.whl")
    _pip("install", "--target", str(root / "target"), str(wheel), cwd=root)
    return root / "target"


def _files(base: Path) -> dict[str, bytes]:
    return {p.relative_to(base).as_posix(): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}


def _run(args: Sequence[str | Path], cwd: Path, pythonpath: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_wheel_ships_every_template_and_preset_as_plain_files(target: Path) -> None:
    for shipped, source in PACKAGE_DATA.items():
        installed = target / "air_hpc" / shipped
        assert not installed.is_symlink()
        assert not [p for p in installed.rglob("*") if p.is_symlink()]
        assert _files(installed) == _files(REPO / source)


def test_installed_wheel_renders_a_job_naming_only_presets_from_an_empty_dir(target: Path, tmp_path: Path) -> None:
    empty, jobs, checkout_cwd = tmp_path / "empty", tmp_path / "jobs", tmp_path / "checkout"
    for folder in (empty, jobs, checkout_cwd):
        folder.mkdir()
    job = write_job(jobs)

    where = _run([sys.executable, "-c", "import air_hpc; print(air_hpc.__file__)"], empty, target)
    assert where.stdout.strip() == str(target / "air_hpc" / "__init__.py"), where.stderr

    rendered = _run([target / "bin" / "air-hpc", "render", job], empty, target)
    assert rendered.returncode == 0, rendered.stderr
    assert "#SBATCH --partition=batch\n" in rendered.stdout  # from the cluster preset
    assert f"#SBATCH --chdir={jobs / 'runs' / 'outside'}\n" in rendered.stdout
    from_checkout = _run([sys.executable, "-m", "air_hpc", "render", job], checkout_cwd, REPO)
    assert from_checkout.returncode == 0, from_checkout.stderr
    assert rendered.stdout == from_checkout.stdout

    shown = _run([target / "bin" / "air-hpc", "config", "show", job, "--json"], empty, target)
    assert shown.returncode == 0, shown.stderr
    config = json.loads(shown.stdout)
    assert (config["cluster"]["name"], config["hardware"]["device"], config["model"]["hidden_size"]) == (
        "testbed",
        "cpu",
        64,
    )
    assert not list(empty.iterdir())


def test_installed_wheel_names_the_known_presets_for_an_unknown_one(target: Path, tmp_path: Path) -> None:
    job = write_job(tmp_path, cluster="testbd")
    result = _run([target / "bin" / "air-hpc", "render", job], tmp_path, target)
    assert result.returncode == 2
    assert result.stdout == "" and result.stderr.count("\n") == 1
    assert f"{job}:5: cluster profile 'testbd' not found; did you mean 'testbed'?" in result.stderr
    assert f"(available: testbed; in {target / 'air_hpc' / 'presets' / 'clusters'})" in result.stderr


def test_installed_wheel_renders_a_preset_by_name_with_its_run_outside_the_package(
    target: Path, tmp_path: Path
) -> None:
    rendered = _run([target / "bin" / "air-hpc", "render", "gpt-tiny-local"], tmp_path, target)
    assert rendered.returncode == 0, rendered.stderr
    assert f"#SBATCH --chdir={tmp_path / 'runs' / 'gpt-tiny-local'}\n" in rendered.stdout
    assert str(target) not in rendered.stdout.split("--chdir=")[1].splitlines()[0]
    assert f"run dir {tmp_path / 'runs' / 'gpt-tiny-local'}" in rendered.stderr
    shown = _run([target / "bin" / "air-hpc", "config", "show", "gpt-tiny-local", "--json"], tmp_path, target)
    assert json.loads(shown.stdout)["data"]["path"] == str(tmp_path / "runs" / "data" / "corpus.h5")
