#!/usr/bin/env bash
# The version matrix: run the integration tests that depend on Slurm's behaviour against a testbed of each
# Slurm build, and print which file passes on which release (the README's table comes from this).
#   usage: AIR_HPC_SLURM_PREFIXES=/opt/slurm/25.05.8:/opt/slurm/26.05.3 scripts/slurm-matrix.sh [TEST_FILE...]
# "system" in the list stands for Debian's Slurm (the CI testbed). Each build gets its own testbed state
# directory, $AIR_HPC_TEST_STATE_DIR-<release> (default /tmp/air-hpc-matrix-<release>), torn down afterwards.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

if [[ -z "${AIR_HPC_SLURM_PREFIXES:-}" ]]; then
    echo "usage: AIR_HPC_SLURM_PREFIXES=PREFIX[:PREFIX...] $0 [TEST_FILE...]  (PREFIX: a build, or 'system')" >&2
    exit 2
fi
# Slurm's behaviour: render accepted, submit and requeue, preemption, spares, placement, parsers, dry runs.
DEFAULT_FILES=(
    tests/integration/test_testbed.py
    tests/integration/test_jobs_testbed.py
    tests/integration/test_resilience_preempt.py
    tests/integration/test_resilience_spares.py
    tests/integration/test_topology_slurm.py
)
files=("$@")
((${#files[@]})) || files=("${DEFAULT_FILES[@]}")
base="${AIR_HPC_TEST_STATE_DIR:-/tmp/air-hpc-matrix}"
IFS=: read -r -a prefixes <<<"$AIR_HPC_SLURM_PREFIXES"
declare -A result
releases=()
for prefix in "${prefixes[@]}"; do
    if [[ "$prefix" == system ]]; then
        release=$(/usr/sbin/slurmctld -V | awk '{print $2}')
        prefix=""
    else
        release=$("$prefix/sbin/slurmctld" -V | awk '{print $2}') || { echo "matrix: $prefix: no slurmctld" >&2; exit 2; }
    fi
    releases+=("$release")
    state="$base-$release"
    for file in "${files[@]}"; do
        echo "matrix: Slurm $release: $file"
        AIR_HPC_SLURM_PREFIX="$prefix" AIR_HPC_TEST_STATE_DIR="$state" \
            nice .venv/bin/pytest -q -p no:cacheprovider "$file" >"$state.$(basename "$file" .py).log" 2>&1
        rc=$?
        summary=$(tail -1 "$state.$(basename "$file" .py).log" | tr -d '=' | sed 's/ in [0-9.]*s.*//; s/^ *//')
        result["$release|$file"]="$([[ $rc -eq 0 ]] && echo pass || echo FAIL): $summary"
    done
    .venv/bin/air-hpc testbed down --state-dir "$state" >/dev/null 2>&1 || true
done
echo
printf '| test file |'; printf ' Slurm %s |' "${releases[@]}"; echo
printf '|---|'; printf -- '---|%.0s' "${releases[@]}"; echo
status=0
for file in "${files[@]}"; do
    printf '| %s |' "$(basename "$file")"
    for release in "${releases[@]}"; do
        cell=${result["$release|$file"]}
        [[ $cell == pass* ]] || status=1
        printf ' %s |' "$cell"
    done
    echo
done
exit "$status"
