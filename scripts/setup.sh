#!/usr/bin/env bash
# Idempotent setup: Slurm/munge/MariaDB/shellcheck from Debian (as root, when missing),
# then a virtual environment with torch pinned to the CPU build before the package.
set -euo pipefail
cd "$(dirname "$0")/.."

DEB_PACKAGES=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server shellcheck)
TORCH_PIN="torch==2.13.0"
VENV="${AIR_HPC_VENV:-.venv}"

missing=()
for pkg in "${DEB_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    if [[ $(id -u) -eq 0 ]]; then
        echo "setup: installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        echo "setup: missing Debian packages (install as root): ${missing[*]}" >&2
    fi
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
fi
# torch first and pinned: a loose requirement would pull a multi-GB CUDA build.
"$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null \
    || "$VENV/bin/pip" install -q "$TORCH_PIN"

stamp="$VENV/.air-hpc-installed"
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]] || ! "$VENV/bin/python" -c "import air_hpc" 2>/dev/null; then
    "$VENV/bin/pip" install -q -e '.[dev]' "$TORCH_PIN"
    echo "$want" >"$stamp"
fi
# Our own bytecode now, not in the first start of every rank (each compiling the same files at once).
"$VENV/bin/python" -m compileall -q air_hpc >/dev/null
echo "setup: ready ($VENV)"
