#!/usr/bin/env bash
# Oversubscription benchmarks on one GPU (GPU=0, nvidia-smi's index). Needs gcc, a built
# gpushare-scheduler (go build -o shim/build/gpushare-scheduler ./cmd/gpushare-scheduler)
# and, for the job tables, python3 with PyTorch.
#   make -C shim bench-oversub [SECTIONS="swap jobs fit"] [QUANTA="5 10 20 30"] [BUDGET_GB=8] [JOB_SECS=40]
#       [JOB_STEPS=auto] [MIX_EVERY= MIX_SLEEP=] [FIT_ROUNDS=6] [FIT_SECS=20] [BENCH_BUDGET_S=0] [SWAP_BYTES=4294967296]
#       [SWAP_PASSES="overlapped:268435456 overlapped:20971520 serial:268435456 serial:20971520"]
#       [PAIRS="heavy mixed"] [BENCH_LOG_LEVEL=info] [GPU=0]
# On a machine of several GPUs, runs on different GPUs (GPU=1 with its own BUILD=) do not share a scheduler,
# a socket or a process: two quantum pairs can run side by side, each with its own serial baseline.
# Prints, side by side in this one run:
#   swap rate     each way, from the shim's own swap log, against a plain pinned copy of the same size
#   job table     nvshare's table: a GPU-heavy pair and a mixed (~50/50 GPU/CPU) pair, working sets 1.5x the
#                 budget, pair time vs the same two jobs one after the other, per quantum; every run checks
#                 the final parameters (sha256 = the job alone without the shim) and every ballast byte
#   fit together  a pair whose working sets fit the budget: shim (Auto) vs no shim, interleaved rounds
#                 (AB BA AB ...), steady-state loop time after a warm-up and a start barrier; median of the
#                 paired ratios and their spread
# JOB_STEPS=auto calibrates the step count so that one job alone takes ~JOB_SECS; the reproduce line
# printed below names the calibrated values. BENCH_BUDGET_S>0: no fit round starts that would end after it.
set -uo pipefail
SHIM_DIR=$(cd "$(dirname "$0")/.." && pwd)
ROOT=$(cd "$SHIM_DIR/.." && pwd)
BUILD=${BUILD:-$SHIM_DIR/build}
SCHED=${GPUSHARE_SCHEDULER:-$BUILD/gpushare-scheduler}
SWAP_BYTES=${SWAP_BYTES:-4294967296}
SWAP_SECS=${SWAP_SECS:-6}
SECTIONS=${SECTIONS:-"swap jobs fit"}
QUANTA=${QUANTA:-"5 10 20 30"}
JOB_SECS=${JOB_SECS:-40}
JOB_STEPS=${JOB_STEPS:-auto}
MIX_EVERY=${MIX_EVERY:-}
MIX_SLEEP=${MIX_SLEEP:-}
MIX_PHASE_S=${MIX_PHASE_S:-2}
BUDGET_GB=${BUDGET_GB:-8}
FIT_BUDGET_GB=${FIT_BUDGET_GB:-16}
FIT_ROUNDS=${FIT_ROUNDS:-6}
FIT_SECS=${FIT_SECS:-20}
FIT_STEPS=${FIT_STEPS:-auto}
FIT_WARMUP=${FIT_WARMUP:-50}
BENCH_BUDGET_S=${BENCH_BUDGET_S:-0}
TRAIN=${TRAIN:-$ROOT/test/gpu/oversub/train.py}
BENCH_T0=$(date +%s)
has() { case " $SECTIONS " in *" $1 "*) return 0 ;; esac; return 1; }
[ -x "$SCHED" ] || { echo "bench-oversub: $SCHED missing: go build -o shim/build/gpushare-scheduler ./cmd/gpushare-scheduler" >&2; exit 1; }
make -s -C "$SHIM_DIR" SHIM_BUILD="$BUILD" all "$BUILD/bench/swap_bench" >/dev/null || exit 1
GPU=${GPU:-0}
UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i "$GPU" | tr -d ' ')
[ -n "$UUID" ] || { echo "bench-oversub: no GPU with index $GPU" >&2; exit 1; }
WORK=$(mktemp -d)
SPID=
start_sched() { # quantum budget mode [scheduler flags...]
    stop_sched
    "$SCHED" --socket-dir "$WORK" --gpu "$UUID:$1::$2:$3" "${@:4}" 2>>"$WORK/sched.log" &
    SPID=$!
    for _ in $(seq 100); do [ -S "$WORK/$UUID.sock" ] && break; sleep 0.05; done
}
stop_sched() { [ -n "$SPID" ] && { kill -INT "$SPID" 2>/dev/null; wait "$SPID" 2>/dev/null; SPID=; }; rm -f "$WORK/$UUID.sock"; }
trap 'stop_sched; rm -rf "$WORK"' EXIT
SHIM_ENV=(CUDA_VISIBLE_DEVICES="$UUID" LD_PRELOAD="$BUILD/libgpushare.so" GPUSHARE_SOCKET="$WORK/$UUID.sock" GPUSHARE_GPU_UUID="$UUID"
    GPUSHARE_OVERSUB=1 GPUSHARE_LOG_LEVEL="${BENCH_LOG_LEVEL:-info}")
fails=0

# rate FILE DIRECTION [steady]: bytes-weighted GB/s over the swaps that moved at least half a working
# set (a swap-in that overlapped the other process's swap-out counts from its first copy, "copying for
# N ms": before that it waited for the first bytes to be released); with "steady", only those that did not wait for their host staging to be page-locked (the shim's
# swap line then says "waited N ms": on a fresh VM the kernel faults never-touched host memory in at
# 2-4 GB/s, and a swap right after a large allocation waits for that first touch; the plain pinned copy
# it is compared with has its first touch in its untimed cuMemAllocHost). Prints rate, swaps, waited ms.
rate() { awk -v dir="$2" -v steady="${3:-}" -v min="$((SWAP_BYTES / 2))" '$0 ~ "swap "dir":" {
        w = 0; for (i = 1; i <= NF; i++) { if ($i == "bytes" && $(i+1) == "in") { b = $(i-1); t = $(i+2) } if ($i == "waited") w = $(i+1); if ($i == "copying" && $(i+1) == "for") t = $(i+2) }
        if (b + 0 >= min && !(steady != "" && w + 0 > 0)) { B += b; T += t; W += w; n++ } }
    END { if (T > 0) printf "%.2f %d %.0f", B / (T * 1e6), n, W; else print "0 0 0" }' "$1"; }

# handoff FILE: median ms of a full hand-off (the swap-out of one process and the swap-in of the other
# that took its memory), from the start of the earlier of the two to the end of the swap-in, over the
# hand-offs that moved at least half a working set each way; and the bytes moved in (median). With the
# directions overlapped (protocol 3) the swap-in line's time runs from the grant, during the other's
# swap-out, so its rate is no longer a copy rate: the hand-off against pinned copies is the measure.
handoff() { awk -v min="$((SWAP_BYTES / 2))" '/swap (out|in):/ {
        pid = $1; ts = $2; dir = ($0 ~ /swap out:/) ? "out" : "in"; b = 0; t = 0
        for (i = 1; i <= NF; i++) if ($i == "bytes" && $(i+1) == "in") { b = $(i-1); t = $(i+2) }
        if (b + 0 < min) next
        n++; P[n] = pid; D[n] = dir; E[n] = ts; S[n] = ts - t / 1000; B[n] = b }
    END { m = 0
        for (i = 1; i <= n; i++) { if (D[i] != "in") continue; best = 0
            for (j = 1; j <= n; j++) if (D[j] == "out" && P[j] != P[i] && S[j] <= E[i] && (best == 0 || S[j] > S[best])) best = j
            if (best == 0) continue
            st = S[i] < S[best] ? S[i] : S[best]; m++; H[m] = (E[i] - st) * 1000; Y[m] = B[i] }
        for (i = 2; i <= m; i++) for (j = i; j > 1 && H[j-1] > H[j]; j--) { x = H[j]; H[j] = H[j-1]; H[j-1] = x }
        for (i = 2; i <= m; i++) for (j = i; j > 1 && Y[j-1] > Y[j]; j--) { x = Y[j]; Y[j] = Y[j-1]; Y[j-1] = x }
        if (m > 0) printf "%.1f %d %.0f", H[int((m + 1) / 2)], m, Y[int((m + 1) / 2)]; else print "0 0 0" }' "$@"; }

# Each pass: two processes of one working set each, the budget fits one. "overlapped" is the product
# (a hand-off's two directions at once); "serial" is the scheduler's --serial-handoffs, where each
# direction runs alone: its per-direction rates are the issue's "swap each way" against a pinned copy.
has swap && echo "== swap rate ($SWAP_BYTES bytes per working set, two processes, budget fits one)"
has swap && for pass in ${SWAP_PASSES:-overlapped:268435456 overlapped:20971520 serial:268435456 serial:20971520}; do
    chunk=${pass#*:} handoffs=${pass%%:*}
    base=$(CUDA_VISIBLE_DEVICES="$UUID" "$BUILD/bench/swap_bench" copy "$SWAP_BYTES" 5)
    flags=(); [ "$handoffs" = serial ] && flags=(--serial-handoffs)
    start_sched 500ms $((SWAP_BYTES + 64 * 1048576)) Auto "${flags[@]}"
    env "${SHIM_ENV[@]}" "$BUILD/bench/swap_bench" hold "$SWAP_BYTES" "$chunk" "$SWAP_SECS" >"$WORK/h1.out" 2>"$WORK/h1.err" &
    P1=$!
    env "${SHIM_ENV[@]}" "$BUILD/bench/swap_bench" hold "$SWAP_BYTES" "$chunk" "$SWAP_SECS" >"$WORK/h2.out" 2>"$WORK/h2.err" &
    P2=$!
    wait $P1 $P2
    stop_sched
    cat "$WORK/h1.err" "$WORK/h2.err" >"$WORK/h.err"
    if [ -n "${BENCH_LOGS:-}" ]; then mkdir -p "$BENCH_LOGS"; cp "$WORK/h.err" "$BENCH_LOGS/swap-$handoffs-$((chunk >> 20))mib.err"; fi
    read -r out nout wout <<<"$(rate "$WORK/h.err" out)"
    read -r in nin win <<<"$(rate "$WORK/h.err" in)"
    read -r sout nsout _ <<<"$(rate "$WORK/h.err" out steady)"
    read -r sin nsin _ <<<"$(rate "$WORK/h.err" in steady)"
    cout=$(sed -n 's/.*out=\([0-9.]*\).*/\1/p' <<<"$base")
    cin=$(sed -n 's/.* in=\([0-9.]*\).*/\1/p' <<<"$base")
    read -r hms nh hb <<<"$(handoff "$WORK/h1.err" "$WORK/h2.err")"
    ok=$(cat "$WORK/h1.out" "$WORK/h2.out" | grep -c "hold done ok=1")
    echo "$handoffs hand-offs, chunk $((chunk >> 20)) MiB: $base"
    awk -v o="$out" -v i="$in" -v co="$cout" -v ci="$cin" -v no="$nout" -v ni="$nin" -v ok="$ok" -v wo="$wout" -v wi="$win" \
        -v so="$sout" -v si="$sin" -v nso="$nsout" -v nsi="$nsin" -v hms="$hms" -v nh="$nh" -v hb="$hb" -v mode="$handoffs" '
        # The target (>= 0.85x a pinned copy each way) is for a direction alone: overlapped directions share
        # the host and the link, so there the hand-off against copies in series is the measure.
        function mark(r) { return mode != "serial" ? "(both directions at once: see the hand-off)" : r >= 0.85 ? "PASS" : "MISS (target >= 0.85x the pinned copy)" }
        BEGIN {
        printf "  every swap:         out %6.2f GB/s (%d swaps, %.0f ms of them waiting for staging)  plain copy %6.2f  ratio %.2f  %s\n", o, no, wo, co, o / co, mark(o / co);
        printf "                      in  %6.2f GB/s (%d swaps, %.0f ms of them waiting for staging)  plain copy %6.2f  ratio %.2f  %s\n", i, ni, wi, ci, i / ci, mark(i / ci);
        printf "  staging pinned (no first touch): out %6.2f GB/s (%d swaps)  ratio %.2f  %s\n", so, nso, so / co, mark(so / co);
        printf "                                   in  %6.2f GB/s (%d swaps)  ratio %.2f  %s\n", si, nsi, si / ci, mark(si / ci);
        printf "  hand-off (one out + the other in, median of %d): %.1f ms for %.2f GB each way; pinned copies of that size: %.1f ms in series, %.1f ms the slower direction alone\n", nh, hms, hb / 1e9, hb / (co * 1e6) + hb / (ci * 1e6), hb / ((co < ci ? co : ci) * 1e6);
        printf "  data intact in both processes: %s\n", ok == 2 ? "yes" : "NO" }'
    [ "$ok" = 2 ] || fails=$((fails + 1))
done

if ! { has jobs || has fit; }; then echo "== $fails failure(s)"; exit $((fails > 0)); fi
if ! python3 -c 'import torch' 2>/dev/null; then
    echo "bench-oversub: no PyTorch, skipping the job tables"
    exit $((fails > 0))
fi
BUDGET=$((BUDGET_GB << 30))
BALLAST=$(awk -v b="$BUDGET_GB" 'BEGIN { printf "%.2f", b * 0.75 - 0.25 }') # model + CUDA context on top: ~0.75 x budget each
now() { date +%s.%N; }
jf() { sed -n "s/.*\"$2\": \"\{0,1\}\([^,\"}]*\)\"\{0,1\}.*/\1/p" "$1"; } # json field
job() { # name shim|lock|plain python-args...
    local name=$1 mode=$2
    shift 2
    case $mode in
    shim) env "${SHIM_ENV[@]}" timeout 400 python3 "$TRAIN" --ballast-gb "$BALLAST" "$@" >"$WORK/$name.json" 2>"$WORK/$name.err" ;;
    lock) env "${SHIM_ENV[@]}" GPUSHARE_OVERSUB=0 timeout 400 python3 "$TRAIN" --ballast-gb "$BALLAST" "$@" >"$WORK/$name.json" 2>"$WORK/$name.err" ;;
    *) CUDA_VISIBLE_DEVICES="$UUID" timeout 400 python3 "$TRAIN" --ballast-gb "$BALLAST" "$@" >"$WORK/$name.json" 2>"$WORK/$name.err" ;;
    esac
}
# swap time (s) summed over the swap log lines of the given files
swapsecs() { cat "$@" | awk '/swap (out|in):/ { for (i = 1; i <= NF; i++) if ($i == "ms") t += $(i-1) } END { printf "%.1f", t / 1000 }'; }

# calibration (no shim): ms per step of the job with this ballast, and the start-up around the loop
STEP_MS= STARTUP=
calibrate() {
    local t0 t1
    t0=$(now); job cal plain --steps 320 --warmup 20; t1=$(now)
    STEP_MS=$(awk -v l="$(jf "$WORK/cal.json" loop_seconds)" 'BEGIN { printf "%.3f", l * 1000 / 300 }')
    STARTUP=$(awk -v a="$t0" -v b="$t1" -v l="$(jf "$WORK/cal.json" loop_seconds)" 'BEGIN { printf "%.1f", b - a - l }')
    echo "   calibration (no shim, ballast $BALLAST GiB): $STEP_MS ms/step, start-up + warm-up + check ${STARTUP} s"
}
if [ "$JOB_STEPS" = auto ] || [ "$FIT_STEPS" = auto ]; then calibrate; fi
if [ "$JOB_STEPS" = auto ]; then
    JOB_STEPS=$(awk -v s="$STEP_MS" -v u="$STARTUP" -v j="$JOB_SECS" 'BEGIN { n = (j - u) * 1000 / s; print (n < 100 ? 100 : int(n)) }')
fi
if [ -z "$MIX_EVERY" ]; then
    MIX_EVERY=$(awk -v s="${STEP_MS:-10}" -v p="$MIX_PHASE_S" 'BEGIN { n = int(p * 1000 / s + 0.5); print (n < 1 ? 1 : n) }')
    MIX_SLEEP=$(awk -v s="${STEP_MS:-10}" -v k="$MIX_EVERY" 'BEGIN { printf "%.2f", k * s / 1000 }')
fi
MIX_STEPS=$(awk -v n="$JOB_STEPS" -v k="$MIX_EVERY" 'BEGIN { m = int(n / 2 / k + 0.5); print (m < 1 ? 1 : m) * k }')
if [ "$FIT_STEPS" = auto ]; then
    FIT_STEPS=$(awk -v s="$STEP_MS" -v f="$FIT_SECS" -v w="$FIT_WARMUP" 'BEGIN { print int(f * 1000 / s / 2) + w }')
fi
echo "reproduce: make -C shim bench-oversub SECTIONS=\"$SECTIONS\" QUANTA=\"$QUANTA\" BUDGET_GB=$BUDGET_GB JOB_STEPS=$JOB_STEPS MIX_EVERY=$MIX_EVERY MIX_SLEEP=$MIX_SLEEP FIT_BUDGET_GB=$FIT_BUDGET_GB FIT_STEPS=$FIT_STEPS FIT_WARMUP=$FIT_WARMUP FIT_ROUNDS=$FIT_ROUNDS BENCH_BUDGET_S=$BENCH_BUDGET_S   (from the repository root, after go build -o shim/build/gpushare-scheduler ./cmd/gpushare-scheduler)"

if has jobs; then
HEAVY=(--steps "$JOB_STEPS")
MIXED=(--steps "$MIX_STEPS" --sleep-every "$MIX_EVERY" --sleep-s "$MIX_SLEEP")
echo "== job table (nvshare's): budget $BUDGET_GB GiB, each job $BALLAST GiB ballast + model (~0.75x the budget): a pair is ~1.5x the budget"
echo "   heavy = $JOB_STEPS steps back to back; mixed = $MIX_STEPS steps, a ${MIX_SLEEP} s CPU phase (sleep) after every $MIX_EVERY steps (~${MIX_SLEEP} s of GPU): ~50/50"
t0=$(now); job alone_heavy plain "${HEAVY[@]}"; t1=$(now); job alone_mixed plain "${MIXED[@]}"; t2=$(now)
heavy=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }'); mixed=$(awk -v a="$t1" -v b="$t2" 'BEGIN { print b - a }')
sha_heavy=$(jf "$WORK/alone_heavy.json" sha256); sha_mixed=$(jf "$WORK/alone_mixed.json" sha256)
printf "   alone (no shim, wall incl. start-up): heavy %.1f s (loop %s s), mixed %.1f s (loop %s s); ballast ok: %s %s\n" "$heavy" \
    "$(jf "$WORK/alone_heavy.json" loop_seconds)" "$mixed" "$(jf "$WORK/alone_mixed.json" loop_seconds)" \
    "$(jf "$WORK/alone_heavy.json" ballast_ok)" "$(jf "$WORK/alone_mixed.json" ballast_ok)"
[ -n "$sha_heavy" ] && [ -n "$sha_mixed" ] || { echo "   FAIL: a job alone did not finish"; sed 's/^/     /' "$WORK/alone_heavy.err" "$WORK/alone_mixed.err" | tail -20; fails=$((fails + 1)); }
echo "   serial baseline measured ONCE per pair type in this run and reused for every quantum below:"
echo "   serial = 2 x the job alone (both jobs of a pair are the same job), no shim"
printf "   %-12s %-8s %9s %9s %7s %-22s %8s %s\n" pair quantum "pair(s)" "serial(s)" ratio "job A/B (s)" "swap(s)" "swaps out/in, data (sha256 = alone, ballast), target"
for q in $QUANTA; do
    for kind in ${PAIRS:-heavy mixed}; do
        if [ $kind = heavy ]; then args=("${HEAVY[@]}"); want=$sha_heavy; serial=$(awk -v h="$heavy" 'BEGIN { print 2 * h }'); tgt=$([ "$q" -ge 30 ] && echo 0.95 || echo 1.00)
        else args=("${MIXED[@]}"); want=$sha_mixed; serial=$(awk -v m="$mixed" 'BEGIN { print 2 * m }'); tgt=0.60; fi
        start_sched "${q}s" "$BUDGET" Auto
        t0=$(now)
        job p1 shim "${args[@]}" &
        A=$!
        job p2 shim "${args[@]}" &
        B=$!
        wait $A $B
        t1=$(now)
        stop_sched
        if [ -n "${BENCH_LOGS:-}" ]; then mkdir -p "$BENCH_LOGS"; for p in p1 p2; do cp "$WORK/$p.err" "$BENCH_LOGS/$kind-q$q-$p.err"; cp "$WORK/$p.json" "$BENCH_LOGS/$kind-q$q-$p.json"; done; fi
        okd=0
        for p in p1 p2; do [ "$(jf "$WORK/$p.json" ballast_ok)" = true ] && [ "$(jf "$WORK/$p.json" sha256)" = "$want" ] && okd=$((okd + 1)); done
        so=$(cat "$WORK/p1.err" "$WORK/p2.err" | grep -c "swap out:"); si=$(cat "$WORK/p1.err" "$WORK/p2.err" | grep -c "swap in:")
        ss=$(swapsecs "$WORK/p1.err" "$WORK/p2.err")
        awk -v n="$kind+$kind" -v q="$q" -v a="$t0" -v b="$t1" -v s="$serial" -v so="$so" -v si="$si" -v ok="$okd" -v ss="$ss" -v tg="$tgt" \
            -v ja="$(jf "$WORK/p1.json" seconds)" -v jb="$(jf "$WORK/p2.json" seconds)" 'BEGIN { r = (b - a) / s;
            printf "   %-12s %-8s %9.1f %9.1f %7.2f %-22s %8s %d/%d, %s, %s\n", n, q "s", b - a, s, r, ja "/" jb, ss, so, si,
                ok == 2 ? "intact" : "CORRUPT", r <= tg ? "<= " tg " met" : "> " tg " MISSED" }'
        if [ "$okd" != 2 ]; then fails=$((fails + 1)); grep -hiE "error|fail|Traceback" "$WORK/p1.err" "$WORK/p2.err" | head -5 | sed 's/^/     /'; fi
    done
done
fi

if has fit; then
BALLAST_FIT=$BALLAST
echo "== working sets that fit together: budget $FIT_BUDGET_GB GiB, two processes of $BALLAST_FIT GiB ballast + model each (the same job as above)"
echo "   arms: no shim (plain) vs shim (GPUSHARE_OVERSUB=1, Auto); same allocator (default caching allocator), same job, same ballast, 2 processes each"
echo "   timed: the steady loop of $((FIT_STEPS - FIT_WARMUP)) steps after $FIT_WARMUP warm-up steps, both processes released together by a barrier;"
echo "   span = last loop end - first loop start; interleaved rounds (odd: plain first, even: shim first); GPU settings untouched"
start_sched 2s $((FIT_BUDGET_GB << 30)) Auto
fitpair() { # arm -> prints span (s) and sum of both loops
    local arm=$1 bd
    bd=$(mktemp -d -p "$WORK")
    job "${arm}1" "$arm" --steps "$FIT_STEPS" --warmup "$FIT_WARMUP" --barrier "$bd" --barrier-n 2 &
    local A=$!
    job "${arm}2" "$arm" --steps "$FIT_STEPS" --warmup "$FIT_WARMUP" --barrier "$bd" --barrier-n 2 &
    local B=$!
    wait $A $B
    for p in 1 2; do [ "$(jf "$WORK/$arm$p.json" ballast_ok)" = true ] || echo "CORRUPT"; done
    awk -v s1="$(jf "$WORK/${arm}1.json" loop_start)" -v s2="$(jf "$WORK/${arm}2.json" loop_start)" \
        -v e1="$(jf "$WORK/${arm}1.json" loop_end)" -v e2="$(jf "$WORK/${arm}2.json" loop_end)" \
        -v l1="$(jf "$WORK/${arm}1.json" loop_seconds)" -v l2="$(jf "$WORK/${arm}2.json" loop_seconds)" 'BEGIN {
        if (s1 == "" || s2 == "") { print "FAILED"; exit }
        s = s1 < s2 ? s1 : s2; e = e1 > e2 ? e1 : e2; printf "%.3f %.3f %.3f\n", e - s, l1, l2 }'
}
: >"$WORK/ratios"
round=0
last=$((2 * (FIT_SECS + 10)))
while [ "$round" -lt "$FIT_ROUNDS" ]; do
    el=$(($(date +%s) - BENCH_T0))
    if [ "$BENCH_BUDGET_S" -gt 0 ] && [ $((el + last * 11 / 10)) -gt "$BENCH_BUDGET_S" ]; then
        echo "   (stopping after $round rounds: the next would end after BENCH_BUDGET_S=$BENCH_BUDGET_S s)"
        break
    fi
    round=$((round + 1))
    r0=$(date +%s)
    if [ $((round % 2)) = 1 ]; then P=$(fitpair plain); S=$(fitpair shim); else S=$(fitpair shim); P=$(fitpair plain); fi
    last=$(($(date +%s) - r0))
    case "$P $S" in *FAILED* | *CORRUPT*) echo "   round $round: FAILED ($P | $S)"; fails=$((fails + 1)); grep -hiE "error|Traceback" "$WORK"/plain?.err "$WORK"/shim?.err | head -5; continue ;; esac
    if [ -n "${BENCH_LOGS:-}" ] && [ "$round" = 1 ]; then mkdir -p "$BENCH_LOGS"; for f in plain1 plain2 shim1 shim2; do cp "$WORK/$f.err" "$BENCH_LOGS/fit-r1-$f.err"; done; fi
    so=$(cat "$WORK/shim1.err" "$WORK/shim2.err" | grep -c "swap out:")
    read -r ps pl1 pl2 <<<"$P"; read -r ss sl1 sl2 <<<"$S"
    awk -v r="$round" -v ps="$ps" -v ss="$ss" -v a="$pl1" -v b="$pl2" -v c="$sl1" -v d="$sl2" -v so="$so" -v o="$([ $((round % 2)) = 1 ] && echo plain,shim || echo shim,plain)" 'BEGIN {
        printf "   round %d (%s): plain span %.2f s (loops %.2f %.2f), shim span %.2f s (loops %.2f %.2f): %+.2f%%, swaps %d\n", r, o, ps, a, b, ss, c, d, (ss / ps - 1) * 100, so }'
    awk -v ps="$ps" -v ss="$ss" 'BEGIN { printf "%.5f %.3f %.3f\n", ss / ps, ps, ss }' >>"$WORK/ratios"
done
stop_sched
sort -n "$WORK/ratios" | awk '{ r[NR] = $1; p[NR] = $2; s[NR] = $3; sp += $2 } END {
    n = NR; if (n == 0) { print "   no complete round"; exit }
    med = (n % 2) ? r[(n + 1) / 2] : (r[n / 2] + r[n / 2 + 1]) / 2
    m = sp / n; for (i = 1; i <= n; i++) v += (p[i] - m) ^ 2; cv = n > 1 ? sqrt(v / (n - 1)) / m * 100 : 0
    printf "   shim vs no shim over %d rounds: median of paired ratios %+.2f%% (min %+.2f%%, max %+.2f%%); plain spans vary %.2f%% (CV) between rounds\n", n, (med - 1) * 100, (r[1] - 1) * 100, (r[n] - 1) * 100, cv
    v = med <= 1.01 ? (r[n] <= 1.01 ? "met (every round <= +1%)" : "met on the median (some rounds above +1%)") : (r[1] > 1.01 ? "NOT met (every round > +1%)" : "inconclusive (median > +1%, some rounds below)")
    printf "   target <= +1%%: %s\n", v }'
fi
[ -n "${BENCH_LOGS:-}" ] && [ -f "$WORK/sched.log" ] && mkdir -p "$BENCH_LOGS" && cp "$WORK/sched.log" "$BENCH_LOGS/scheduler.log"
echo "== $fails failure(s)"
exit $((fails > 0))
