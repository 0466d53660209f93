#!/usr/bin/env bash
# Set up, lint, type-check and run the whole suite (unit + integration on a real Slurm testbed).
# The testbed lives in a fresh state dir and is torn down even when the tests fail.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# shellcheck disable=SC1091
source "${AIR_HPC_VENV:-.venv}/bin/activate"

state_dir=$(mktemp -d -t air-hpc-test-XXXXXX)
export AIR_HPC_TEST_STATE_DIR="$state_dir"
cleanup() {
    air-hpc testbed down --state-dir "$state_dir" >/dev/null 2>&1 || true
}
trap cleanup EXIT

ruff check air_hpc tests scripts
mypy
pytest -q -p no:cacheprovider --timeout=900 "$@"
