#!/usr/bin/env bash
# Set up, lint, type-check and run the whole suite (unit + integration on a real Slurm testbed).
# The testbed lives in a fresh state dir and is torn down even when the tests fail.
#
#   scripts/test.sh            the whole suite, as CI runs it (.ci/run)
#   scripts/test.sh --fast     the fast tier for your own loop: lint, types and the unit tests not marked
#                              slow; no testbed (a few minutes on 2 cores)
# Further arguments go to pytest (scripts/test.sh --fast -k chaos, scripts/test.sh tests/integration/x.py).
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
if [[ "${1:-}" == "--fast" ]]; then
    fast=1
    shift
fi
scripts/setup.sh
# shellcheck disable=SC1091
source "${AIR_HPC_VENV:-.venv}/bin/activate"

ruff check air_hpc tests scripts
mypy
if ((fast)); then
    exec pytest -q -p no:cacheprovider -m "not slow and not integration" tests/unit "$@"
fi

state_dir=$(mktemp -d -t air-hpc-test-XXXXXX)
export AIR_HPC_TEST_STATE_DIR="$state_dir"
cleanup() {
    air-hpc testbed down --state-dir "$state_dir" >/dev/null 2>&1 || true
}
trap cleanup EXIT
pytest -q -p no:cacheprovider --timeout=900 --durations=30 "$@"
