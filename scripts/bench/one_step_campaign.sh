#!/usr/bin/env bash
# Issue 23's campaign: rank-kill, node-kill, a frozen step, a frozen save and ckpt-kill into gpt-tiny on the
# testbed with three spares, snapshots every step and the shipped health limits, beside an untouched reference.
#
# Runs tests/integration/test_chaos_one_step_testbed.py (which checks at most one step lost per fault, hangs
# caught at learned limits, bit for bit equal losses and weights) and prints each fault's detection, loss and
# fault to first resumed step, the median, and the goodput of the campaign against the reference's measured in
# the same run (about 125 s on 2 cores; CI runs the same test). Usage: scripts/bench/one_step_campaign.sh [PYTEST ARGS]
# (AIR_HPC_TEST_STATE_DIR=DIR reuses a testbed).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
exec "${PYTHON:-.venv/bin/python}" -m pytest -q -s -p no:cacheprovider tests/integration/test_chaos_one_step_testbed.py "$@"
