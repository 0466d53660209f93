#!/usr/bin/env bash
# Record what a real Slurm prints, in the formats air_hpc/slurm/ parses, as parser fixtures:
# tests/data/slurm/<version>/ (tests/unit/test_slurm_version.py and test_slurm_fixtures.py read them).
# Runs against a testbed that is up: `air-hpc testbed up --state-dir DIR [--slurm-prefix PREFIX]`.
#   usage: scripts/slurm-capture.sh STATE_DIR [OUT_ROOT]   (OUT_ROOT: default tests/data/slurm)
# It submits a few short jobs to the testbed's batch partition and cancels them.
set -euo pipefail
cd "$(dirname "$0")/.."

if (($# < 1 || $# > 2)); then
    echo "usage: $0 STATE_DIR [OUT_ROOT]" >&2
    exit 2
fi
eval "$(air-hpc testbed env --state-dir "$1")"   # SLURM_CONF, and PATH when the testbed runs a build
version=$(scontrol --version | awk '{print $2}')
out="${2:-tests/data/slurm}/$version"
mkdir -p "$out"
echo "slurm-capture: Slurm $version ($(command -v sbatch)) into $out"

# Fields and formats the client asks for (air_hpc/slurm/jobs.py, nodes.py, cluster.py).
SQUEUE_FORMAT='%i|%T|%D|%N|%r|%M|%l|%j'
SACCT_FIELDS='JobID,State,ExitCode,NNodes,NodeList,Elapsed,Timelimit,JobName'
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '#!/bin/sh\n#SBATCH --nodes=2\n#SBATCH --time=5\nsleep 600\n' >"$work/two.sbatch"
printf '#!/bin/sh\n#SBATCH --nodes=999\nsleep 1\n' >"$work/too-big.sbatch"

scontrol --version >"$out/scontrol-version.out"
sbatch --version >"$out/sbatch-version.out"
sbatch --test-only "$work/two.sbatch" >"$out/sbatch-test-only.out" 2>&1
sbatch --test-only "$work/too-big.sbatch" >"$out/sbatch-test-only-refused.out" 2>&1 || true

running=$(sbatch --parsable --job-name='sleepy | name' "$work/two.sbatch")
held=$(sbatch --parsable --hold --job-name=held "$work/two.sbatch")
done_id=$(sbatch --parsable --nodes=1 --job-name=quick --wrap='exit 3')
requeued=$(sbatch --parsable --nodes=1 --job-name=requeued --requeue --wrap='sleep 600')
for _ in $(seq 60); do
    [[ $(squeue --noheader --jobs="$running,$requeued" --states=RUNNING --format=%i | wc -l) -eq 2 ]] && break
    sleep 1
done
scontrol requeue "$requeued"
sleep 3
squeue --noheader --format="$SQUEUE_FORMAT" >"$out/squeue.out"
squeue --noheader --format='%i|%Z|%k' >"$out/squeue-tagged.out"
scontrol --oneliner show job "$running" >"$out/scontrol-show-job-running.out"
scontrol --oneliner show job "$held" >"$out/scontrol-show-job-held.out"
scontrol --oneliner show job "$requeued" >"$out/scontrol-show-job-requeued.out"
scontrol --oneliner show nodes >"$out/scontrol-show-nodes.out"
sinfo --Node --noheader --format='%N %T' >"$out/sinfo-node-states.out"
sinfo --noheader --format='%R|%D|%c|%m|%G' >"$out/sinfo-groups.out"
scontrol show partition --oneliner >"$out/scontrol-show-partition.out"
scontrol show topology >"$out/scontrol-show-topology.out"
scontrol show config >"$out/scontrol-show-config.out"
scancel "$running" "$held" "$requeued"
sleep 5   # accounting records reach slurmdbd asynchronously
sacct --noheader --parsable2 --allocations --duplicates --format="$SACCT_FIELDS" \
    --jobs="$running,$held,$done_id,$requeued" >"$out/sacct.out"
echo "slurm-capture: wrote $(find "$out" -type f | wc -l) files"
