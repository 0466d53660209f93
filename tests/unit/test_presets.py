"""Package data: every batch template is found; presets by name from a job file anywhere; an unknown name is one
line, exit 2."""

from pathlib import Path

import pytest
import yaml

from air_hpc.cli.main import main
from air_hpc.config import load_job
from air_hpc.config.load import PRESETS_DIR
from air_hpc.render.script import _environment

REPO = Path(__file__).resolve().parents[2]

#: A job that names only presets (cluster, hardware, model); tests copy it outside the repo.
PRESETS_ONLY_JOB = REPO / "tests" / "data" / "presets-only-job.yaml"


def write_job(directory: Path, cluster: str = "testbed") -> Path:
    path = directory / "job.yaml"
    path.write_text(PRESETS_ONLY_JOB.read_text().replace("cluster: testbed", f"cluster: {cluster}"))
    return path


def test_every_file_in_sbatch_is_a_template_by_name() -> None:
    """Named includes split out of the job template are found without listing them anywhere."""
    files = sorted(p.relative_to(REPO / "sbatch").as_posix() for p in (REPO / "sbatch").rglob("*") if p.is_file())
    assert sorted(_environment().list_templates()) == files


def test_presets_are_the_checkouts_configs() -> None:
    assert (REPO / "configs").resolve() == PRESETS_DIR


def test_a_job_outside_the_repo_names_presets(tmp_path: Path) -> None:
    job = load_job(write_job(tmp_path))
    model = yaml.safe_load((REPO / "configs" / "models" / "gpt-tiny.yaml").read_text())
    assert job.cluster.name == "testbed" and job.cluster.partition == "batch"
    assert job.hardware.name == "cpu-testbed" and job.hardware.device == "cpu"
    assert job.model.hidden_size == model["hidden_size"] and job.model.num_layers == model["num_layers"]
    assert job.run.root == tmp_path / "runs"


def test_unknown_preset_is_one_line_naming_key_and_known_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = write_job(tmp_path, cluster="testbd")
    with pytest.raises(SystemExit) as info:
        main(["render", str(job)])
    out, err = capsys.readouterr()
    assert info.value.code == 2
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"error: {job}:5: cluster profile 'testbd' not found; did you mean 'testbed'?")
    assert "(available: testbed; in " in err and str(PRESETS_DIR / "clusters") in err


def test_unknown_preset_from_set_names_the_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["config", "show", str(write_job(tmp_path)), "--set", "hardware=h300-sxm"])
    _, err = capsys.readouterr()
    assert info.value.code == 2 and err.count("\n") == 1
    assert err.startswith("error: --set hardware: hardware profile 'h300-sxm' not found; did you mean 'h200-sxm'?")
    assert "available: cpu-testbed, gb200-nvl72, h100-sxm, h200-sxm, mi300x;" in err
