"""Bad input stops ``python -m air_hpc.runtime RUN_DIR`` (what srun runs) with one line and exit 2.

Each case fails before any process group starts: the runs have no Slurm or
rendezvous environment at all, so reaching the process group would fail
differently (and no rank log would be written).
"""

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from air_hpc.config.load import load_job
from air_hpc.exitcodes import ExitCode
from air_hpc.records.rundir import RunDir
from air_hpc.train import data

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def run_dir(tmp_path: Path) -> RunDir:
    corpus = tmp_path / "corpus.h5"
    data.prepare([REPO / "README.md"], corpus, data.ByteTokenizer())
    job = load_job(
        REPO / "configs/jobs/gpt-tiny-local.yaml",
        [f"run.root={tmp_path}", f"data.path={corpus}"],
    )
    rd = RunDir.of(job)
    rd.write_job(job)
    return rd


def _edit(rd: RunDir, change: Callable[[dict[str, Any]], None]) -> None:
    raw = json.loads(rd.job_json.read_text())
    change(raw)
    rd.job_json.write_text(json.dumps(raw))


def _set(section: str, key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda raw: raw[section].__setitem__(key, value)


def _corrupt(rd: RunDir) -> None:
    path = Path(json.loads(rd.job_json.read_text())["data"]["path"])
    path.write_bytes(path.read_bytes()[:2000])


CASES: dict[str, tuple[Callable[[RunDir], None], str]] = {
    "missing-data": (lambda rd: _edit(rd, _set("data", "path", "/nonexistent/corpus.h5")), "no such HDF5"),
    "corrupt-data": (_corrupt, "cannot read as HDF5"),
    "seq-len-too-long": (lambda rd: _edit(rd, _set("model", "seq_len", 10**7)), "shorter than one sample"),
    "vocab-too-small": (lambda rd: _edit(rd, _set("model", "vocab_size", 128)), "model.vocab_size 128"),
    "world-not-divisible": (lambda rd: _edit(rd, _set("parallel", "tp", 3)), "not divisible by tp*pp"),
    "layers-vs-pp": (lambda rd: _edit(rd, _set("model", "num_layers", 3)), "layers are not divisible"),
    "heads-vs-tp": (lambda rd: _edit(rd, _set("model", "num_attention_heads", 3)), "heads are not divisible"),
    "sp-on-cpu": (lambda rd: _edit(rd, _set("parallel", "sequence_parallel", True)), "sequence_parallel"),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_and_exit_2(run_dir: RunDir, case: str) -> None:
    breaker, expected = CASES[case]
    breaker(run_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_", "MASTER_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "air_hpc.runtime", str(run_dir.path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    lines = proc.stderr.splitlines()  # one line per problem (a tp of 3 also breaks the heads and the vocab)
    assert lines and all(line.startswith("error: ") for line in lines), proc.stderr
    assert expected in proc.stderr and "Traceback" not in proc.stderr
    assert not run_dir.logs.exists()
