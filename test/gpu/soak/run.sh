#!/usr/bin/env bash
# The GPU soak: real PyTorch and CuPy processes through the standalone scheduler with one claim on GPU 0,
# a seeded random mix for DURATION seconds (default 600) of CUDA contexts, allocations of 256 MiB to
# 2 GiB (some past the claim), frees, matrix products, exits, and SIGKILLs of clients and of the
# scheduler; after every step invariants 1, 2, 5 and 6 of docs/reliability.md ("Soak") are checked
# against NVML (nvidia-smi --query-compute-apps) and the scheduler's metrics. A violation prints the seed
# and the step; the log goes to test/gpu/soak/results/<gpu>-<date>.log; exit status 1 on any violation.
#
#   test/gpu/soak/run.sh [SEED]      (from the repository root; SEED default 1)
# Needs: nvidia-smi, python3 with torch and cupy (a kind that does not import is left out), gcc;
# test/gpu/soak/bin/gpushare-scheduler, built where Go is:
#   CGO_ENABLED=1 go build -o test/gpu/soak/bin/gpushare-scheduler ./cmd/gpushare-scheduler
# Knobs: DURATION (s), CLAIM (bytes, default 8 GiB), RESERVE (default 768 MiB, the agent's
# --context-reserve), KINDS (default torch,cupy).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
HERE=$ROOT/test/gpu/soak
SEED=${1:-1}
make -s -C "$ROOT/shim" all >/dev/null || exit 1
kinds=()
for k in $(tr ',' ' ' <<<"${KINDS:-torch,cupy}"); do
    python3 -c "import $k" 2>/dev/null && kinds+=("$k") || echo "soak: $k does not import; left out"
done
[ ${#kinds[@]} -gt 0 ] || { echo "soak: neither torch nor cupy imports"; exit 1; }
UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | tr ' ' '-')
LOG=$HERE/results/$GPU-$(date -u +%F)-seed$SEED.log
{
    echo "gpu soak: $(date -u +%FT%TZ) seed $SEED, $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i 0)," \
        "kinds ${kinds[*]}: $(python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)' 2>/dev/null)" \
        "$(python3 -c 'import cupy; print("cupy", cupy.__version__)' 2>/dev/null)"
    python3 "$HERE/soak.py" --seed "$SEED" --duration "${DURATION:-600}" --scheduler "$HERE/bin/gpushare-scheduler" \
        --shim "$ROOT/shim/build/libgpushare.so" --uuid "$UUID" --claim "${CLAIM:-$((8 << 30))}" \
        --reserve "${RESERVE:-$((768 << 20))}" --kinds "$(IFS=,; echo "${kinds[*]}")"
} 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
