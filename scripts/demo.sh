#!/usr/bin/env bash
# Set up, then run the demo on the embedded Slurm testbed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# shellcheck disable=SC1091
source "${AIR_HPC_VENV:-.venv}/bin/activate"
exec air-hpc demo "$@"
