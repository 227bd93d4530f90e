#!/usr/bin/env bash
# Right-sizing on a real GPU (docs/rightsizing.md): a PyTorch workload whose peak is set runs three times
# (three pods of a workload); NVML's per-process memory is read every 100 ms (nvidia-smi), and each run's
# peak goes through internal/recommend as the manager takes it (rscheck):
#   1. the recommended target lies within the stated margin above NVML's highest peak: at least peak
#      x 1.10, at most peak x 1.05 (the bucket) x 1.10;
#   2. the workload runs to the end under the shim's memory limit set to the claim size recommended
#      (GPUSHARE_MEMORY_LIMIT_BYTES, what a sized claim sets for its pod), and NVML's peak stays within it;
#   3. the control: under a limit of half the peak the same workload is refused memory (exit 3), so (2)
#      can fail.
# This runs the workload and the recommender's arithmetic, not the manager and agent on a cluster.
# Prints one PASS/FAIL line per check and the figures; exit status 1 on any FAIL.
#
#   test/gpu/rightsize/run.sh [LOG]     (from the repository root)
# Needs: nvidia-smi, python3 with torch, gcc (the shim); test/gpu/rightsize/bin/rscheck, built where Go is:
#   go build -o test/gpu/rightsize/bin/rscheck ./test/gpu/rightsize/rscheck
# Knobs: PEAK_MIB (the tensors, default 3072), STEP (bytes, default 512 MiB), GPU (default 0).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
HERE=$ROOT/test/gpu/rightsize
SHIM=$ROOT/shim/build/libgpushare.so
PEAK_MIB=${PEAK_MIB:-3072}
STEP=${STEP:-$((512 << 20))}
GPU=${GPU:-0}
[ $# -ge 1 ] && exec > >(tee "$1") 2>&1
make -s -C "$ROOT/shim" all >/dev/null || exit 1
fails=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }
echo "rightsize: $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i "$GPU")" \
    "torch $(python3 -c 'import torch; print(torch.__version__, torch.version.cuda)')"

# run NAME [ENV...]: runs the workload with ENV, samples NVML's figure for its pid every 100 ms, and sets
# RC and PEAK (bytes).
run() {
    local name=$1; shift
    env CUDA_VISIBLE_DEVICES="$GPU" PEAK_MIB="$PEAK_MIB" "$@" python3 "$HERE/workload.py" >"$WORK/$name.out" 2>&1 &
    local pid=$! max=0 used
    while kill -0 "$pid" 2>/dev/null; do
        used=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits -i "$GPU" 2>/dev/null |
            awk -F', *' -v p="$pid" '$1 == p {print $2}')
        [ -n "$used" ] && [ "$used" -gt "$max" ] && max=$used
        sleep 0.1
    done
    wait "$pid"
    RC=$?
    PEAK=$((max << 20))
    echo "$name: exit $RC, NVML peak $max MiB; $(tail -1 "$WORK/$name.out")"
}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

peaks=()
for i in 1 2 3; do
    run "run-$i"
    [ "$RC" -eq 0 ] || fail "run $i of the workload ended with exit $RC"
    peaks+=("$PEAK")
done
top=$(printf '%s\n' "${peaks[@]}" | sort -n | tail -1)
out=$("$HERE/bin/rscheck" -step "$STEP" "${peaks[@]}") || { fail "rscheck: $out"; exit 1; }
target=${out#target=}; target=${target%% *}
claim=${out##*claim=}
echo "peaks ${peaks[*]} bytes; highest $((top >> 20)) MiB; target $((target >> 20)) MiB; claim $((claim >> 20)) MiB"
python3 - "$top" "$target" <<'PY' && pass "target within the margin above NVML's peak" || fail "target outside [peak x 1.10, peak x 1.05 x 1.10]"
import sys
top, target = int(sys.argv[1]), int(sys.argv[2])
lo, hi = top * 1.10, top * 1.05 * 1.10 + (1 << 20)
print(f"target {target} in [{lo:.0f}, {hi:.0f}]: {lo <= target <= hi}")
sys.exit(0 if lo <= target <= hi else 1)
PY

run "at-claim" LD_PRELOAD="$SHIM" GPUSHARE_MEMORY_LIMIT_BYTES="$claim"
if [ "$RC" -eq 0 ] && [ "$PEAK" -le "$claim" ]; then
    pass "the workload runs under a limit of the recommended claim ($((claim >> 20)) MiB), NVML peak $((PEAK >> 20)) MiB"
else
    fail "under the recommended claim ($((claim >> 20)) MiB): exit $RC, NVML peak $((PEAK >> 20)) MiB"
fi

run "at-half" LD_PRELOAD="$SHIM" GPUSHARE_MEMORY_LIMIT_BYTES="$((top / 2))"
if [ "$RC" -eq 3 ]; then
    pass "control: refused memory under half the peak ($((top >> 21)) MiB)"
else
    fail "control: under half the peak the workload ended with exit $RC, not refused"
fi
echo "rightsize: $fails failed"
[ "$fails" -eq 0 ]
