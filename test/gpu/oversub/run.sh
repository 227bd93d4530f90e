#!/usr/bin/env bash
# Oversubscription on a real GPU (GPU 0): PyTorch training under all three
# allocator settings (default cudaMalloc, backend:cudaMallocAsync,
# expandable_segments:True), two jobs at a time whose working sets add up to
# ~1.5x the budget, must give bit-identical parameters to runs without the
# shim (and keep every byte of their ballast) while swapping; then
# `make -C shim bench-oversub SECTIONS=swap` (BENCH_SECTIONS="swap jobs fit" for the job table and the
# fit-together overhead too: ~15 minutes more). Needs gcc, python3 with PyTorch, and
#   go build -o shim/build/gpushare-scheduler ./cmd/gpushare-scheduler   (elsewhere: no Go needed here)
#   test/gpu/oversub/run.sh        (from the repository root; run.log lands in $OUT, default /tmp/gpu-oversub-out)
# ALLOCATORS (default: all three) picks settings, e.g. ALLOCATORS=backend:cudaMallocAsync.
# The budget (BUDGET_GB, default 4) stays far below the card: nothing asks for
# more device memory than is free, and no managed memory is used.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
OUT=${OUT:-/tmp/gpu-oversub-out}
mkdir -p "$OUT"
BUILD=$ROOT/shim/build
STEPS=${STEPS:-300}
QUANTUM=${QUANTUM:-200ms}
BUDGET_GB=${BUDGET_GB:-4}
TRAIN=$ROOT/test/gpu/oversub/train.py
T=$(mktemp -d)
exec > >(tee "$OUT/run.log") 2>&1
fails=0
check() { if [ -n "$2" ] && [ "$2" = "$3" ]; then echo "PASS $1"; else echo "FAIL $1: '$2' != '$3'"; fails=$((fails + 1)); fi; }
field() { sed -n "s/.*\"$2\": \"\{0,1\}\([^,\"}]*\)\"\{0,1\}.*/\1/p" "$1"; }

nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.used,memory.total --format=csv
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
make -s -C "$ROOT/shim" all || exit 1
[ -x "$BUILD/gpushare-scheduler" ] || { echo "missing $BUILD/gpushare-scheduler"; exit 1; }
UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0 | tr -d ' ')
SOCK_DIR=$(mktemp -d)
BUDGET=$((BUDGET_GB << 30))
BALLAST=$(awk -v b="$BUDGET_GB" 'BEGIN { printf "%.2f", b * 0.75 - 0.25 }')
"$BUILD/gpushare-scheduler" --socket-dir "$SOCK_DIR" --gpu "$UUID:$QUANTUM:2s:$BUDGET:Auto" -v 1 2>"$T/scheduler.log" &
SPID=$!
for _ in $(seq 100); do [ -S "$SOCK_DIR/$UUID.sock" ] && break; sleep 0.05; done
SHIM=(env CUDA_VISIBLE_DEVICES=0 LD_PRELOAD="$BUILD/libgpushare.so" GPUSHARE_SOCKET="$SOCK_DIR/$UUID.sock"
    GPUSHARE_GPU_UUID="$UUID" GPUSHARE_OVERSUB=1 GPUSHARE_LOG_LEVEL=info)
echo "== budget $BUDGET_GB GiB, quantum $QUANTUM, two jobs of $STEPS steps with $BALLAST GiB ballast each"
for conf in ${ALLOCATORS:-default backend:cudaMallocAsync expandable_segments:True}; do
    [ "$conf" = default ] && conf=""
    name=${conf:-default}
    name=${name%%:*}
    echo "-- allocator: ${conf:-default (cudaMalloc)}"
    PYTORCH_CUDA_ALLOC_CONF=$conf CUDA_VISIBLE_DEVICES=0 timeout 120 python3 "$TRAIN" --steps "$STEPS" --ballast-gb "$BALLAST" >"$T/base_$name.json" 2>"$T/base_$name.err"
    cat "$T/base_$name.json"
    PYTORCH_CUDA_ALLOC_CONF=$conf "${SHIM[@]}" timeout 240 python3 "$TRAIN" --steps "$STEPS" --ballast-gb "$BALLAST" >"$T/a_$name.json" 2>"$T/a_$name.err" &
    P1=$!
    PYTORCH_CUDA_ALLOC_CONF=$conf "${SHIM[@]}" timeout 240 python3 "$TRAIN" --steps "$STEPS" --ballast-gb "$BALLAST" >"$T/b_$name.json" 2>"$T/b_$name.err" &
    P2=$!
    wait $P1 $P2
    cat "$T/a_$name.json" "$T/b_$name.json"
    want=$(field "$T/base_$name.json" sha256)
    for j in a b; do
        check "$name: job $j bit-identical to the run without the shim" "$(field "$T/${j}_$name.json" sha256)" "$want"
        check "$name: job $j ballast intact" "$(field "$T/${j}_$name.json" ballast_ok)" true
        grep -E "swap stats|oversubscription is off|warn|error" "$T/${j}_$name.err" | sed 's/^/  /' | head -5
        echo "  swaps logged: out $(grep -c 'swap out:' "$T/${j}_$name.err"), in $(grep -c 'swap in:' "$T/${j}_$name.err")"
    done
    n=$(cat "$T/a_$name.err" "$T/b_$name.err" | grep -c "swap out:")
    if [ "$n" -gt 0 ]; then echo "PASS $name: the pair swapped ($n swap-outs)"; else echo "FAIL $name: no swapping"; fails=$((fails + 1)); fi
    check "$name: cuMemGetInfo reports the budget as total" "$(field "$T/a_$name.json" mem_total)" "$BUDGET"
    check "$name: no process refused" "$(cat "$T/a_$name.err" "$T/b_$name.err" | grep -c "oversubscription is off")" 0
    if [ "$name" = backend ]; then
        r=$(sed -n 's/.*async_reused=\([0-9]*\).*/\1/p' "$T/a_$name.err" | tail -1)
        if [ "${r:-0}" -gt 0 ]; then echo "PASS backend: freed stream-ordered memory reused ($r times)"; else echo "FAIL backend: no reuse"; fails=$((fails + 1)); fi
    fi
done
kill -INT $SPID
wait $SPID
echo "== scheduler"
grep -E "^gpusharing_|^client |^gpu " "$T/scheduler.log"
rm -rf "$SOCK_DIR"
tar czf "$OUT/logs.tgz" -C "$T" . 2>/dev/null

echo "== benchmarks"
BENCH=${BENCH:-1}
if [ "$BENCH" = 1 ]; then
    make -C "$ROOT/shim" bench-oversub BUDGET_GB="$BUDGET_GB" SECTIONS="${BENCH_SECTIONS:-swap}" 2>&1 || fails=$((fails + 1))
fi
echo "== $fails failure(s)"
[ "$fails" -eq 0 ]
