#!/usr/bin/env bash
# What a sized GPU can really give its claims, measured on the GPU this runs on (read-only: no MIG, compute
# mode or time-slice change; the MPS daemon lives under a temporary folder and is quit before the end):
#   - NVML's memory of the idle GPU (nvmlDeviceGetMemoryInfo_v2: total, reserved, free, used);
#   - what one process's CUDA context costs in NVML's per-process figure, for a bare CUDA context
#     (CuPy), a PyTorch process after its first kernel, and a PyTorch process as an MPS client;
#   - what the MPS server itself holds on the GPU while it serves one client.
# These set the agent's --context-reserve and --mps-server-reserve defaults (docs/dra.md, "What a sized
# GPU offers").
#   test/gpu/capacity/measure.sh [LOG]      (from the repository root, on the GPU machine)
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 1 ] && exec > >(tee "$1") 2>&1
echo "capacity: $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader -i 0)"
python3 "$HERE/memory.py" idle
for kind in cupy torch; do python3 "$HERE/memory.py" "$kind"; done
WORK=$(mktemp -d)
export CUDA_MPS_PIPE_DIRECTORY=$WORK/pipe CUDA_MPS_LOG_DIRECTORY=$WORK/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
trap 'echo quit | nvidia-cuda-mps-control >/dev/null 2>&1; rm -rf "$WORK"' EXIT
CUDA_VISIBLE_DEVICES=0 nvidia-cuda-mps-control -d
python3 "$HERE/memory.py" torch-mps
echo quit | nvidia-cuda-mps-control
