#!/usr/bin/env bash
# Sized MPS claims on a GPU machine: what the DRA kubelet plugin writes for an 8Gi/25 % claim and a
# 16Gi/50 % claim (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<MiB>M, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), two
# PyTorch clients of one MPS daemon started at the GPU's defaults, as the agent starts a sized GPU's:
#   1. A (8 GiB, 25 %) fills memory until torch.OutOfMemoryError while B (16 GiB, 50 %) holds 12 GiB and
#      computes; each prints mem_get_info, NVML's memory and its SM count.
#   2. A again with the shim loaded and GPUSHARE_MEMORY_LIMIT_BYTES at its claim: what mem_get_info
#      reports to a client of MPS when the shim reports the claim.
# The daemon lives under a temporary directory and is quit before the script ends.
#   test/gpu/cap/mps.sh [LOG]        (from the repository root)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
HERE=$ROOT/test/gpu/cap
SHIM=$ROOT/shim/build/libgpushare.so
[ $# -ge 1 ] && exec > >(tee "$1") 2>&1
make -s -C "$ROOT/shim" all >/dev/null || exit 1
WORK=$(mktemp -d)
export CUDA_MPS_PIPE_DIRECTORY=$WORK/pipe CUDA_MPS_LOG_DIRECTORY=$WORK/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
quit() { echo quit | nvidia-cuda-mps-control >/dev/null 2>&1; sleep 1; rm -rf "$WORK"; }
trap quit EXIT
echo "mps: $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv,noheader -i 0)" \
    "torch $(python3 -c 'import torch; print(torch.__version__, torch.version.cuda)')"
nvidia-cuda-mps-control -d || exit 1
claim() { # MiB percent: the env a sized MPS claim's CDI spec gives
    echo CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=$1M CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$2
}
echo "== A: $(claim 8192 25) fills until OOM; B: $(claim 16384 50) holds 12 GiB and computes"
env $(claim 16384 50) python3 "$HERE/cap_demo.py" --name B --dir "$WORK" --hold 12 >"$WORK/B.out" 2>"$WORK/B.err" &
BP=$!
sleep 10
env $(claim 8192 25) python3 "$HERE/cap_demo.py" --name A --dir "$WORK" --fill >"$WORK/A.out" 2>"$WORK/A.err"
echo "A exit $?"
wait $BP
echo "B exit $?"
cat "$WORK/A.out" "$WORK/B.out"
tail -n 3 "$WORK/A.err" "$WORK/B.err"
rm -f "$WORK/A.oom"
echo "== A again, with the shim reporting its claim: $(claim 8192 25) LD_PRELOAD=shim GPUSHARE_MEMORY_LIMIT_BYTES=$((8 << 30))"
env $(claim 8192 25) LD_PRELOAD="$SHIM" GPUSHARE_MEMORY_LIMIT_BYTES=$((8 << 30)) python3 "$HERE/cap_demo.py" --name A --dir "$WORK" --fill >"$WORK/A2.out" 2>"$WORK/A2.err"
echo "A exit $?"
cat "$WORK/A2.out"
grep -v "GPU lock disabled" "$WORK/A2.err" | tail -3
