#!/bin/bash
# GPU benchmark: gpt-1.3b in bf16 on one GPU (NCCL, CUDA torch) for a few dozen steps, then its MFU.
#
# Trains scripts/bench/gpt-1.3b-1gpu.yaml through the real entry point (submitit's LocalExecutor,
# one rank, NCCL) and prints:
#   - model FLOPs per step (air_hpc.train.metrics.flops_per_token x tokens per step, from the config),
#   - the median step time after warm-up, the model TFLOP/s and the MFU against the GPU's dense
#     bf16 peak (by torch.cuda.get_device_name(), air_hpc.train.metrics.PEAK_BF16_FLOPS),
#   - the baseline measured in the same run: a bare bf16 8192^3 matmul's TFLOP/s on the same GPU,
#     and the ratio model / matmul.
# Usage: scripts/bench/gpu.sh [STEPS] (default 30); extra settings via AIR_HPC_GPU_SET="key=value ...".
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
steps=${1:-30}
python=${PYTHON:-python}

if ! "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() and torch.version.cuda else 1)' 2>/dev/null; then
    echo "gpu.sh: needs a CUDA build of torch and a visible GPU (torch.cuda.is_available() is false here)" >&2
    exit 2
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/air-hpc-gpu.XXXXXX")
corpus="$work/corpus.h5"
cd "$repo"
"$python" -m air_hpc data prepare --project -o "$corpus" >/dev/null
# One GPU, no network: keep NCCL on loopback whatever the hardware profile names.
export NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1
read -r -a extra <<<"${AIR_HPC_GPU_SET:-}"
set_args=()
for kv in "run.root=$work" "data.path=$corpus" "train.steps=$steps" "${extra[@]}"; do
    set_args+=(--set "$kv")
done
"$python" -m air_hpc submit scripts/bench/gpt-1.3b-1gpu.yaml --executor local --wait "${set_args[@]}"

"$python" - "$work/gpt-1.3b-1gpu" <<'PY'
import statistics
import sys
import time
from pathlib import Path

import torch

from air_hpc.records.metrics import read_metrics
from air_hpc.records.rundir import RunDir
from air_hpc.train.metrics import flops_per_token, peak_flops

run = RunDir(Path(sys.argv[1]))
job = run.read_job()
rows = read_metrics(run.metrics)
warmup = min(5, len(rows) // 2)
step_s = statistics.median(r["step_time_s"] for r in rows[warmup:])
tokens = job.train.global_batch_size * job.model.seq_len
flops_step = flops_per_token(job.model) * tokens
name = torch.cuda.get_device_name()
peak = peak_flops(name)
if peak is None:
    sys.exit(f"gpu.sh: no bf16 peak known for {name!r}; add it to air_hpc.train.metrics.PEAK_BF16_FLOPS")

a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn_like(a)
for _ in range(3):
    a @ b
torch.cuda.synchronize()
started = time.perf_counter()
for _ in range(20):
    a @ b
torch.cuda.synchronize()
matmul = 20 * 2 * 8192**3 / (time.perf_counter() - started)

achieved = flops_step / step_s
print(f"device                 {name}")
print(f"model                  {job.model.name}, {job.precision}, {tokens} tokens/step, {len(rows)} steps")
print(f"model FLOPs per step   {flops_step / 1e12:.1f} TFLOP")
print(f"step time (median)     {step_s:.3f} s (after {warmup} warm-up steps)")
print(f"model TFLOP/s          {achieved / 1e12:.1f}")
print(f"MFU                    {achieved / peak:.3f}  (peak {peak / 1e12:.0f} TFLOP/s bf16 dense)")
print(f"baseline: bf16 matmul  {matmul / 1e12:.1f} TFLOP/s  ({matmul / peak:.3f} of peak)")
print(f"ratio model / matmul   {achieved / matmul:.3f}")
PY
echo "run directory: $work/gpt-1.3b-1gpu"
