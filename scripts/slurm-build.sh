#!/usr/bin/env bash
# Build a Slurm source tree into PREFIX, with munge and MariaDB (slurmdbd) support, so that the
# testbed can run slurmctld, slurmd and slurmdbd of that version (`air-hpc testbed up --slurm-prefix`).
# Idempotent: build dependencies are installed only when missing (as root), and a prefix that
# already holds this source's version is left as it is.
#   usage: scripts/slurm-build.sh SOURCE PREFIX   (SOURCE: an unpacked Slurm source tree)
# Slurm's source is public: github.com/SchedMD/slurm, tags such as slurm-25-05-8-1.
set -euo pipefail

if (($# != 2)); then
    echo "usage: $0 SOURCE PREFIX" >&2
    exit 2
fi
SOURCE=$(realpath "$1")
PREFIX=$(realpath -m "$2")
JOBS="${SLURM_BUILD_JOBS:-2}"

if [[ ! -x "$SOURCE/configure" || ! -f "$SOURCE/META" ]]; then
    echo "slurm-build: $SOURCE is not a Slurm source tree (no configure or META)" >&2
    exit 2
fi
VERSION=$(awk '$1 == "Version:" {print $2; exit}' "$SOURCE/META")

# Headers configure looks for: without munge there is no auth plugin, without MariaDB no
# accounting_storage/mysql (slurmdbd cannot start), without json-c no JSON output (--json).
BUILD_PACKAGES=(build-essential pkg-config python3 libmunge-dev libjson-c-dev libmariadb-dev)
missing=()
for pkg in "${BUILD_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    if [[ $(id -u) -ne 0 ]]; then
        echo "slurm-build: missing Debian packages (install as root): ${missing[*]}" >&2
        exit 2
    fi
    echo "slurm-build: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The testbed runs one slurmd per emulated node on one host: without multiple-slurmd support every
# node after the first shares NodeHostname, is left out of the address table ("Duplicated
# NodeHostName"), and messages slurmd forwards to it are lost (nodes go DOWN, not responding).
CONFIGURE_ARGS=(--prefix="$PREFIX" --sysconfdir="$PREFIX/etc" --enable-multiple-slurmd --without-hdf5 --disable-debug)
STAMP="$PREFIX/share/air-hpc-slurm-build"
if [[ -x "$PREFIX/sbin/slurmctld" && -f "$STAMP" && "$(cat "$STAMP")" == "$VERSION ${CONFIGURE_ARGS[*]}" ]]; then
    echo "slurm-build: $PREFIX already holds Slurm $VERSION built with ${CONFIGURE_ARGS[*]}"
    exit 0
fi

# Out-of-tree build: the source tree stays as unpacked, and a failed build restarts cleanly.
BUILD_DIR="${SLURM_BUILD_DIR:-$SOURCE/../build-slurm-$VERSION}"
mkdir -p "$BUILD_DIR"
cd "$BUILD_DIR"
echo "slurm-build: configuring Slurm $VERSION for $PREFIX in $BUILD_DIR"
"$SOURCE/configure" "${CONFIGURE_ARGS[@]}" >configure.log 2>&1 ||
    { tail -30 configure.log >&2; exit 1; }
# configure only warns when a library is missing; a build without these cannot run the testbed.
grep -q '^#define MULTIPLE_SLURMD 1' config.h || { echo "slurm-build: configure left out multiple-slurmd" >&2; exit 1; }
for feature in WITH_MUNGE WITH_MYSQL WITH_JSON_PARSER; do
    grep -qF "S[\"${feature}_TRUE\"]=\"\"" config.status ||
        { echo "slurm-build: configure left out $feature (see $BUILD_DIR/configure.log)" >&2; exit 1; }
done
echo "slurm-build: building with $JOBS jobs (log: $BUILD_DIR/make.log)"
nice make -j"$JOBS" >make.log 2>&1 || { tail -30 make.log >&2; exit 1; }
make install >install.log 2>&1 || { tail -30 install.log >&2; exit 1; }
mkdir -p "$(dirname "$STAMP")"
echo "$VERSION ${CONFIGURE_ARGS[*]}" >"$STAMP"
echo "slurm-build: installed $("$PREFIX/sbin/slurmctld" -V) into $PREFIX"
