#!/usr/bin/env bash
# Real-GPU tests of the shim (GPU 0), then its benchmarks. Needs nvcc, gcc,
# python3 with PyTorch, and a gpushare-scheduler binary built elsewhere:
#   go build -o shim/build/gpushare-scheduler ./cmd/gpushare-scheduler
#   test/gpu/shim/run.sh            (from the repository root; run.log and logs.tgz land in $OUT, default /tmp/gpu-shim-out)
# Checks: PyTorch training and inference (with CUDA-graph capture and replay)
# under the shim, alone and two at a time, give bit-identical results to runs
# without it; the shim saw the launches (call counts); then `make -C shim bench`.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
OUT=${OUT:-/tmp/gpu-shim-out}
mkdir -p "$OUT"
BUILD=$ROOT/shim/build
STEPS=${STEPS:-300}
QUANTUM=${QUANTUM:-50ms}
W=$ROOT/test/gpu/shim/workload.py
LOG=$OUT/run.log
T=$(mktemp -d) # per-run files; packed into $OUT/logs.tgz at the end (one archive of the run's hundreds of files)
exec > >(tee "$LOG") 2>&1
fails=0
# check NAME GOT WANT: equal and non-empty (an empty digest means the workload failed).
check() {
    if [ -n "$2" ] && [ "$2" = "$3" ]; then echo "PASS $1 ($2)"; else echo "FAIL $1: '$2' != '$3'"; fails=$((fails + 1)); fi
}

nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.used --format=csv
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
make -s -C "$ROOT/shim" all || exit 1
[ -x "$BUILD/gpushare-scheduler" ] || { echo "missing $BUILD/gpushare-scheduler"; exit 1; }

UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0 | tr -d ' ')
SOCK_DIR=$(mktemp -d)
"$BUILD/gpushare-scheduler" --socket-dir "$SOCK_DIR" --gpu "$UUID:$QUANTUM:2s" -v 1 2>"$T/scheduler.log" &
SPID=$!
for _ in $(seq 100); do [ -S "$SOCK_DIR/$UUID.sock" ] && break; sleep 0.05; done
SHIM=(env CUDA_VISIBLE_DEVICES=0 LD_PRELOAD="$BUILD/libgpushare.so" GPUSHARE_SOCKET="$SOCK_DIR/$UUID.sock"
    GPUSHARE_GPU_UUID="$UUID" GPUSHARE_LOG_LEVEL=debug)
digest() { sed -n 's/.*"sha256": "\([0-9a-f]*\)".*/\1/p' "$1"; }

echo "== baseline (no shim)"
for m in train infer; do
    CUDA_VISIBLE_DEVICES=0 python3 "$W" "$m" --steps "$STEPS" >"$T/base_$m.json" 2>"$T/base_$m.err"
    cat "$T/base_$m.json"
    [ -n "$(digest "$T/base_$m.json")" ] || { echo "FAIL baseline $m:"; tail -5 "$T/base_$m.err"; fails=$((fails + 1)); }
done

echo "== shim, one process at a time (quantum $QUANTUM)"
for m in train infer; do
    "${SHIM[@]}" python3 "$W" "$m" --steps "$STEPS" >"$T/alone_$m.json" 2>"$T/alone_$m.err"
    cat "$T/alone_$m.json"
    check "shim alone $m bit-identical" "$(digest "$T/alone_$m.json")" "$(digest "$T/base_$m.json")"
    grep -E "calls cu(LaunchKernel|LaunchKernelEx|GraphLaunch|MemAlloc|MemcpyAsync|MemcpyHtoDAsync|MemcpyDtoHAsync|StreamBeginCapture|MemsetD)|lock grants|warn" "$T/alone_$m.err" | sed 's/^/  /'
done

echo "== shim, two processes at a time on GPU 0 (train + infer, then train + train)"
"${SHIM[@]}" python3 "$W" train --steps "$STEPS" >"$T/pair_train.json" 2>"$T/pair_train.err" &
P1=$!
"${SHIM[@]}" python3 "$W" infer --steps "$STEPS" >"$T/pair_infer.json" 2>"$T/pair_infer.err" &
P2=$!
wait $P1 $P2
cat "$T/pair_train.json" "$T/pair_infer.json"
check "shim pair train bit-identical" "$(digest "$T/pair_train.json")" "$(digest "$T/base_train.json")"
check "shim pair infer bit-identical" "$(digest "$T/pair_infer.json")" "$(digest "$T/base_infer.json")"
"${SHIM[@]}" python3 "$W" train --steps "$STEPS" >"$T/pair2_a.json" 2>"$T/pair2_a.err" &
P1=$!
"${SHIM[@]}" python3 "$W" train --steps "$STEPS" >"$T/pair2_b.json" 2>"$T/pair2_b.err" &
P2=$!
wait $P1 $P2
cat "$T/pair2_a.json" "$T/pair2_b.json"
check "shim train+train A bit-identical" "$(digest "$T/pair2_a.json")" "$(digest "$T/base_train.json")"
check "shim train+train B bit-identical" "$(digest "$T/pair2_b.json")" "$(digest "$T/base_train.json")"
for f in pair_train pair_infer pair2_a pair2_b; do
    echo "  $f: $(grep -E 'lock grants|revoked|GPU lock disabled' "$T/$f.err" | tr '\n' ' ')"
done
kill -INT $SPID
wait $SPID
echo "== scheduler"
grep -E "^gpusharing_|^client " "$T/scheduler.log"
grep -c "Revoking" "$T/scheduler.log" | sed 's/^/revocations logged: /'
rm -rf "$SOCK_DIR"

echo "== benchmarks"
make -C "$ROOT/shim" bench || fails=$((fails + 1))
tar czf "$OUT/logs.tgz" -C "$T" . && rm -rf "$T"
echo "== $fails failure(s)"
[ "$fails" -eq 0 ]
