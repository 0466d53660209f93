"""``submit --dry-run`` of a GPU job on the testbed's CPU partition: doctor's words, not Slurm's (issue 24 item 6).

The real slurmctld refuses ``sbatch --test-only`` with "Invalid generic resource (gres) specification";
submit explains it with the finding ``doctor`` gives for the same job, and exits 2 having submitted nothing.
"""

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from air_hpc.train import data

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
#: 8 ranks per node, two cores each (the GPU nodes here have 16, not the preset's 112).
GPU_JOB = (
    "hardware=h100-sxm",
    "resources.tasks_per_node=8",
    "resources.cpus_per_task=2",
    "train.global_batch_size=8",
    "train.micro_batch_size=1",
)


def air_hpc(args: list[str], testbed: Any, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **testbed.env}
    return subprocess.run(
        [sys.executable, "-m", "air_hpc", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_a_gpu_job_on_a_cpu_partition_is_refused_in_doctors_words(testbed: Any, tmp_path: Path) -> None:
    corpus = data.prepare([REPO / "README.md"], tmp_path / "corpus.h5", data.ByteTokenizer()).path
    sets = [f"run.root={tmp_path / 'runs'}", f"data.path={corpus}", "placement.topology_aware=false", *GPU_JOB]
    job = [str(REPO / "configs/jobs/gpt-tiny-testbed.yaml"), *(w for s in sets for w in ("--set", s))]
    doctor = air_hpc(["doctor", *job], testbed, tmp_path)
    words = "hardware h100-sxm uses 8 GPUs per node but partition batch has no GPU gres"
    assert doctor.returncode == 1 and words in doctor.stdout, doctor.stdout + doctor.stderr
    for extra in (["--dry-run"], []):
        refused = air_hpc(["submit", *job, *extra], testbed, tmp_path)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        lines = refused.stderr.splitlines()
        assert f"error: hardware.gpus_per_node: {words} (sinfo %G shows none); pick a GPU partition" in lines
        assert lines[-1] == "error: sbatch --test-only refused the job: Invalid generic resource (gres) specification"
    assert not (tmp_path / "runs").exists()  # nothing recorded, nothing submitted
