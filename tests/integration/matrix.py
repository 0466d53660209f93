"""Which Slurm the integration tests run: Debian's, or one build of the version matrix (scripts/slurm-matrix.sh)."""

import os
from pathlib import Path

from air_hpc.testbed.prefix import SlurmBuild, check_prefix


def matrix_build() -> SlurmBuild | None:
    """The Slurm build ``AIR_HPC_SLURM_PREFIX`` names (one column of the matrix); None: Debian's."""
    prefix = os.environ.get("AIR_HPC_SLURM_PREFIX")
    return check_prefix(Path(prefix)) if prefix else None
