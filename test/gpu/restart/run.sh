#!/usr/bin/env bash
# Scheduler restarts on a real GPU (GPU 0): two oversubscribed PyTorch jobs
# (working sets ~1.5x the budget together, so one of them has memory swapped
# out at any time) run under the shim; while they swap, the scheduler is
# SIGKILLed, stays down for OUTAGE_S seconds and is started again on the same
# socket. Both jobs must reconnect and re-announce, the new scheduler must
# rebuild its account from their reports, and both must finish with
# parameters bit-identical to a run without the shim and every ballast byte
# intact (nothing swapped out was lost), under each allocator setting.
# Needs gcc, python3 with PyTorch, and
#   go build -o shim/build/gpushare-scheduler ./cmd/gpushare-scheduler   (elsewhere: no Go needed here)
#   test/gpu/restart/run.sh    (from the repository root; run.log lands in $OUT, default /tmp/gpu-restart-out)
# ALLOCATORS (default: all three) picks settings, e.g. ALLOCATORS=default.
# The budget (BUDGET_GB, default 4) stays far below the card: nothing asks for
# more device memory than is free, and no managed memory is used.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
OUT=${OUT:-/tmp/gpu-restart-out}
mkdir -p "$OUT"
BUILD=$ROOT/shim/build
STEPS=${STEPS:-2000}
QUANTUM=${QUANTUM:-200ms}
BUDGET_GB=${BUDGET_GB:-4}
OUTAGE_S=${OUTAGE_S:-2}
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
SPID=
start_scheduler() { # $1: log file
    "$BUILD/gpushare-scheduler" --socket-dir "$SOCK_DIR" --gpu "$UUID:$QUANTUM:2s:$BUDGET:Auto" -v 1 2>"$1" &
    SPID=$!
    for _ in $(seq 200); do grep -q "Serving GPU lock" "$1" 2>/dev/null && return 0; sleep 0.05; done
    echo "scheduler did not start"; cat "$1"; return 1
}
SHIM=(env CUDA_VISIBLE_DEVICES=0 LD_PRELOAD="$BUILD/libgpushare.so" GPUSHARE_SOCKET="$SOCK_DIR/$UUID.sock"
    GPUSHARE_GPU_UUID="$UUID" GPUSHARE_OVERSUB=1 GPUSHARE_LOG_LEVEL=info)
echo "== budget $BUDGET_GB GiB, quantum $QUANTUM, two jobs of $STEPS steps with $BALLAST GiB ballast each; outage ${OUTAGE_S}s"
for conf in ${ALLOCATORS:-default backend:cudaMallocAsync expandable_segments:True}; do
    [ "$conf" = default ] && conf=""
    name=${conf:-default}
    name=${name%%:*}
    echo "-- allocator: ${conf:-default (cudaMalloc)}"
    PYTORCH_CUDA_ALLOC_CONF=$conf CUDA_VISIBLE_DEVICES=0 timeout 150 python3 "$TRAIN" --steps "$STEPS" --ballast-gb "$BALLAST" >"$T/base_$name.json" 2>"$T/base_$name.err"
    cat "$T/base_$name.json"
    start_scheduler "$T/sched1_$name.log" || { fails=$((fails + 1)); continue; }
    t0=$(date +%s.%N)
    PYTORCH_CUDA_ALLOC_CONF=$conf "${SHIM[@]}" timeout 300 python3 "$TRAIN" --steps "$STEPS" --ballast-gb "$BALLAST" >"$T/a_$name.json" 2>"$T/a_$name.err" &
    P1=$!
    PYTORCH_CUDA_ALLOC_CONF=$conf "${SHIM[@]}" timeout 300 python3 "$TRAIN" --steps "$STEPS" --ballast-gb "$BALLAST" >"$T/b_$name.json" 2>"$T/b_$name.err" &
    P2=$!
    # Kill once both swapped (one of them then has memory out at any moment), mid-run.
    for _ in $(seq 1200); do
        [ "$(cat "$T/a_$name.err" "$T/b_$name.err" | grep -c "swap out:")" -ge 2 ] && break
        sleep 0.05
    done
    sleep 1
    midrun=no
    kill -0 $P1 2>/dev/null && kill -0 $P2 2>/dev/null && midrun=yes
    kill -KILL $SPID
    wait $SPID 2>/dev/null
    tk=$(date +%s.%N)
    check "$name: scheduler SIGKILLed while both jobs ran" "$midrun" yes
    sleep "$OUTAGE_S"
    start_scheduler "$T/sched2_$name.log" || { fails=$((fails + 1)); }
    wait $P1 $P2
    te=$(date +%s.%N)
    cat "$T/a_$name.json" "$T/b_$name.json"
    want=$(field "$T/base_$name.json" sha256)
    for j in a b; do
        check "$name: job $j bit-identical to the run without the shim" "$(field "$T/${j}_$name.json" sha256)" "$want"
        check "$name: job $j ballast intact" "$(field "$T/${j}_$name.json" ballast_ok)" true
        check "$name: job $j reconnected" "$(grep -c 'reconnected to the GPU scheduler' "$T/${j}_$name.err")" 1
        grep -E "went away|reconnected|restor|swap stats" "$T/${j}_$name.err" | sed 's/^/  /' | head -6
    done
    echo "  killed at +$(awk -v a="$t0" -v b="$tk" 'BEGIN{printf "%.1f", b-a}') s, jobs done at +$(awk -v a="$t0" -v b="$te" 'BEGIN{printf "%.1f", b-a}') s"
    echo "  swapped out at the kill: $(cat "$T/a_$name.err" "$T/b_$name.err" | grep -o 'while [0-9]* bytes of this process.s GPU memory are swapped out' | head -2 | tr '\n' ';')"
    n=$(grep -c "Shim client re-announced itself" "$T/sched2_$name.log")
    check "$name: the new scheduler rebuilt its account from both jobs" "$n" 2
    grep "Restarted on a socket left" "$T/sched2_$name.log" | head -1 | sed 's/^/  /'
    n=$(cat "$T/a_$name.err" "$T/b_$name.err" | grep -c "swap out:")
    echo "  swap-outs in all: $n"
    kill -INT $SPID
    wait $SPID
    grep -E "^gpu |handoffs_total|evictions_total" "$T/sched2_$name.log" | sed 's/^/  scheduler after restart: /'
done
rm -rf "$SOCK_DIR"
tar czf "$OUT/logs.tgz" -C "$T" . 2>/dev/null
echo "== $fails failure(s)"
[ "$fails" -eq 0 ]
