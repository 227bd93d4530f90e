#!/usr/bin/env bash
# Oversubscription benchmarks on a GPU (GPU 0). Needs gcc, a built
# gpushare-scheduler (go build -o shim/build/gpushare-scheduler ./cmd/gpushare-scheduler)
# and, for the job tables, python3 with PyTorch.
#   make -C shim bench-oversub [SWAP_BYTES=4294967296] [QUANTA="1 2"] [JOB_STEPS=600] [BUDGET_GB=4]
# Prints, side by side in this one run:
#   swap rate     each way, from the shim's own swap log, against a plain pinned copy of the same size
#   job table     GPU-heavy pair and mixed pair (working sets 1.5x the budget): total time vs serial, per quantum
#   fit together  a pair whose working sets fit the budget: time with the shim (Auto) vs without it
set -uo pipefail
SHIM_DIR=$(cd "$(dirname "$0")/.." && pwd)
ROOT=$(cd "$SHIM_DIR/.." && pwd)
BUILD=${BUILD:-$SHIM_DIR/build}
SCHED=${GPUSHARE_SCHEDULER:-$BUILD/gpushare-scheduler}
SWAP_BYTES=${SWAP_BYTES:-4294967296}
SWAP_SECS=${SWAP_SECS:-6}
QUANTA=${QUANTA:-"1 2"}
JOB_STEPS=${JOB_STEPS:-600}
BUDGET_GB=${BUDGET_GB:-4}
TRAIN=$ROOT/test/gpu/oversub/train.py
echo "reproduce: make -C shim bench-oversub SWAP_BYTES=$SWAP_BYTES SWAP_SECS=$SWAP_SECS QUANTA=\"$QUANTA\" JOB_STEPS=$JOB_STEPS BUDGET_GB=$BUDGET_GB   (from the repository root)"
[ -x "$SCHED" ] || { echo "bench-oversub: $SCHED missing: go build -o shim/build/gpushare-scheduler ./cmd/gpushare-scheduler" >&2; exit 1; }
make -s -C "$SHIM_DIR" SHIM_BUILD="$BUILD" all "$BUILD/bench/swap_bench" >/dev/null || exit 1
UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0 | tr -d ' ')
WORK=$(mktemp -d)
SPID=
start_sched() { # quantum budget mode
    stop_sched
    "$SCHED" --socket-dir "$WORK" --gpu "$UUID:$1::$2:$3" 2>>"$WORK/sched.log" &
    SPID=$!
    for _ in $(seq 100); do [ -S "$WORK/$UUID.sock" ] && break; sleep 0.05; done
}
stop_sched() { [ -n "$SPID" ] && { kill -INT "$SPID" 2>/dev/null; wait "$SPID" 2>/dev/null; SPID=; }; rm -f "$WORK/$UUID.sock"; }
trap 'stop_sched; rm -rf "$WORK"' EXIT
SHIM_ENV=(CUDA_VISIBLE_DEVICES=0 LD_PRELOAD="$BUILD/libgpushare.so" GPUSHARE_SOCKET="$WORK/$UUID.sock" GPUSHARE_GPU_UUID="$UUID"
    GPUSHARE_OVERSUB=1 GPUSHARE_LOG_LEVEL=info)
fails=0

# rate FILE DIRECTION: bytes-weighted GB/s over the swaps that moved at least half a working set
rate() { awk -v dir="$2" -v min="$((SWAP_BYTES / 2))" '$0 ~ "swap "dir":" { for (i = 1; i <= NF; i++) { if ($i == "bytes") b = $(i-1); if ($i == "ms") t = $(i-1) } if (b + 0 >= min) { B += b; T += t; n++ } }
    END { if (T > 0) printf "%.2f %d", B / (T * 1e6), n; else print "0 0" }' "$1"; }

echo "== swap rate ($SWAP_BYTES bytes per working set, two processes, budget fits one)"
for chunk in 268435456 20971520; do
    base=$(CUDA_VISIBLE_DEVICES=0 "$BUILD/bench/swap_bench" copy "$SWAP_BYTES" 5)
    start_sched 500ms $((SWAP_BYTES + 64 * 1048576)) Auto
    env "${SHIM_ENV[@]}" "$BUILD/bench/swap_bench" hold "$SWAP_BYTES" "$chunk" "$SWAP_SECS" >"$WORK/h1.out" 2>"$WORK/h1.err" &
    P1=$!
    env "${SHIM_ENV[@]}" "$BUILD/bench/swap_bench" hold "$SWAP_BYTES" "$chunk" "$SWAP_SECS" >"$WORK/h2.out" 2>"$WORK/h2.err" &
    P2=$!
    wait $P1 $P2
    stop_sched
    cat "$WORK/h1.err" "$WORK/h2.err" >"$WORK/h.err"
    read -r out nout <<<"$(rate "$WORK/h.err" out)"
    read -r in nin <<<"$(rate "$WORK/h.err" in)"
    cout=$(sed -n 's/.*out=\([0-9.]*\).*/\1/p' <<<"$base")
    cin=$(sed -n 's/.* in=\([0-9.]*\).*/\1/p' <<<"$base")
    ok=$(cat "$WORK/h1.out" "$WORK/h2.out" | grep -c "hold done ok=1")
    echo "chunk $((chunk >> 20)) MiB: $base"
    awk -v o="$out" -v i="$in" -v co="$cout" -v ci="$cin" -v no="$nout" -v ni="$nin" -v ok="$ok" 'BEGIN {
        printf "  swap out %6.2f GB/s (%d swaps)  plain copy %6.2f  ratio %.2f  %s\n", o, no, co, o / co, (o >= 44 && o >= 0.8 * co) ? "PASS" : "MISS (target >= 44 GB/s and >= 0.8x)";
        printf "  swap in  %6.2f GB/s (%d swaps)  plain copy %6.2f  ratio %.2f  %s\n", i, ni, ci, i / ci, (i >= 44 && i >= 0.8 * ci) ? "PASS" : "MISS (target >= 44 GB/s and >= 0.8x)";
        printf "  data intact in both processes: %s\n", ok == 2 ? "yes" : "NO" }'
    [ "$ok" = 2 ] || fails=$((fails + 1))
done

if ! python3 -c 'import torch' 2>/dev/null; then
    echo "bench-oversub: no PyTorch, skipping the job tables"
    exit $((fails > 0))
fi
BUDGET=$((BUDGET_GB << 30))
BALLAST=$(awk -v b="$BUDGET_GB" 'BEGIN { printf "%.2f", b * 0.75 - 0.25 }') # model + CUDA context on top: ~0.75 x budget each
job() { # name heavy|mixed shim|lock|plain
    local extra=()
    [ "$2" = mixed ] && extra=(--sleep-every 100 --sleep-s 0.5)
    if [ "$3" = shim ]; then
        env "${SHIM_ENV[@]}" python3 "$TRAIN" --steps "$JOB_STEPS" --ballast-gb "$BALLAST" "${extra[@]}" >"$WORK/$1.json" 2>"$WORK/$1.err"
    elif [ "$3" = lock ]; then
        env "${SHIM_ENV[@]}" GPUSHARE_OVERSUB=0 python3 "$TRAIN" --steps "$JOB_STEPS" --ballast-gb "$BALLAST" "${extra[@]}" >"$WORK/$1.json" 2>"$WORK/$1.err"
    else
        CUDA_VISIBLE_DEVICES=0 python3 "$TRAIN" --steps "$JOB_STEPS" --ballast-gb "$BALLAST" "${extra[@]}" >"$WORK/$1.json" 2>"$WORK/$1.err"
    fi
}
now() { date +%s.%N; }
echo "== job table (budget $BUDGET_GB GiB, each job ~$BALLAST GiB ballast + model: working sets ~1.5x the budget together; $JOB_STEPS steps)"
echo "   quanta shortened from nvshare's 5/10/20/30 s to: $QUANTA s (device time)"
t0=$(now); job alone_heavy heavy plain; t1=$(now); job alone_mixed mixed plain; t2=$(now)
heavy=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }'); mixed=$(awk -v a="$t1" -v b="$t2" 'BEGIN { print b - a }')
printf "   alone (no shim): heavy %.1f s, mixed %.1f s\n" "$heavy" "$mixed"
printf "   %-12s %-8s %10s %10s %8s %s\n" pair quantum "pair (s)" "serial(s)" ratio "swaps out/in, data"
for q in $QUANTA; do
    for pair in "heavy heavy" "heavy mixed"; do
        set -- $pair
        start_sched "${q}s" "$BUDGET" Auto
        t0=$(now)
        job p1 "$1" shim &
        A=$!
        job p2 "$2" shim &
        B=$!
        wait $A $B
        t1=$(now)
        stop_sched
        serial=$(awk -v h="$heavy" -v m="$mixed" -v k="$2" 'BEGIN { print h + (k == "mixed" ? m : h) }')
        okd=$(cat "$WORK/p1.json" "$WORK/p2.json" | grep -c '"ballast_ok": true')
        so=$(cat "$WORK/p1.err" "$WORK/p2.err" | grep -c "swap out:"); si=$(cat "$WORK/p1.err" "$WORK/p2.err" | grep -c "swap in:")
        awk -v n="$1+$2" -v q="$q" -v a="$t0" -v b="$t1" -v s="$serial" -v so="$so" -v si="$si" -v ok="$okd" 'BEGIN {
            printf "   %-12s %-8s %10.1f %10.1f %8.2f %d/%d, %s\n", n, q "s", b - a, s, (b - a) / s, so, si, ok == 2 ? "intact" : "CORRUPT" }'
        [ "$okd" = 2 ] || fails=$((fails + 1))
    done
done

echo "== working sets that fit together (budget 16 GiB, 1 GiB ballast each): pair with the shim (Auto) vs without"
echo "   (also the shim with the lock only, GPUSHARE_OVERSUB=0, to tell the lock's cost from the memory manager's)"
BALLAST=1
for round in 1 2 3; do
    t0=$(now); job f1 heavy plain & A=$!; job f2 heavy plain & B=$!; wait $A $B; t1=$(now)
    start_sched 2s $((16 << 30)) Auto
    t2=$(now); job g1 heavy shim & A=$!; job g2 heavy shim & B=$!; wait $A $B; t3=$(now)
    t4=$(now); job l1 heavy lock & A=$!; job l2 heavy lock & B=$!; wait $A $B; t5=$(now)
    stop_sched
    so=$(cat "$WORK/g1.err" "$WORK/g2.err" | grep -c "swap out:")
    awk -v r="$round" -v a="$t0" -v b="$t1" -v c="$t2" -v d="$t3" -v e="$t4" -v f="$t5" -v so="$so" 'BEGIN {
        printf "   round %d: without %.2f s, with shim %.2f s: %+.1f%% (target <= +3%%), swaps %d; lock only %.2f s: %+.1f%%\n", r, b - a, d - c, ((d - c) / (b - a) - 1) * 100, so, f - e, ((f - e) / (b - a) - 1) * 100 }'
    grep -h "swap stats" "$WORK/g1.err" | sed 's/^/     /'
done
echo "== $fails failure(s)"
exit $((fails > 0))
