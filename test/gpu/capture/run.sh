#!/usr/bin/env bash
# CUDA graph capture and replay under oversubscription, on a GPU machine.
#
# For each case (PyTorch's three allocators with torch.cuda.graph, and torch.compile(mode=
# "reduce-overhead") with the default allocator), capture.py runs once without the shim (the
# reference), then twice at once under the shim with GPUSHARE_OVERSUB=1 and a scheduler whose budget
# is smaller than the two working sets together, so each hand-off swaps one process out and the
# other in. Every process's output checksum (sha256 over all steps) must equal the reference, its
# ballast must be intact, and the shim must have swapped (its "swap stats: out=N" line, N > 0).
#
#   test/gpu/capture/run.sh [LOG]          (from the repository root; LOG defaults to stdout)
# Needs: nvidia-smi, python3 with torch, gcc (the shim is built here), and the scheduler at
# shim/build/gpushare-scheduler (CGO_ENABLED=1 go build -o shim/build/gpushare-scheduler ./cmd/gpushare-scheduler).
# Knobs: BUDGET_GB (default 6), BALLAST_GB (default 2.5 per process), STEPS (default 60), CASES,
# SHIM (another build of libgpushare.so).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
HERE=$ROOT/test/gpu/capture
BUILD=$ROOT/shim/build
SCHED=${GPUSHARE_SCHEDULER:-$BUILD/gpushare-scheduler}
SHIM=${SHIM:-$BUILD/libgpushare.so}
BUDGET_GB=${BUDGET_GB:-6}
BALLAST_GB=${BALLAST_GB:-2.5}
STEPS=${STEPS:-60}
CASES=${CASES:-"graph:default graph:backend:cudaMallocAsync graph:expandable_segments:True compile:default"}
[ -x "$SCHED" ] || { echo "capture: $SCHED missing" >&2; exit 1; }
make -s -C "$ROOT/shim" all >/dev/null || exit 1
UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i "${GPU:-0}" | tr -d ' ')
WORK=$(mktemp -d)
SPID=
stop_sched() { [ -n "$SPID" ] && { kill -INT "$SPID" 2>/dev/null; wait "$SPID" 2>/dev/null; SPID=; }; rm -f "$WORK/$UUID.sock"; }
trap 'stop_sched; rm -rf "$WORK"' EXIT
echo "capture: $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader -i "${GPU:-0}")" \
    "torch $(python3 -c 'import torch; print(torch.__version__, torch.version.cuda)')"
echo "shim $SHIM; budget ${BUDGET_GB} GiB, ballast ${BALLAST_GB} GiB per process, ${STEPS} steps, two processes under the shim"
fails=0
for c in $CASES; do
    mode=${c%%:*}
    alloc=${c#*:}
    conf=()
    [ "$alloc" != default ] && conf=(PYTORCH_CUDA_ALLOC_CONF="$alloc")
    args=(--mode "$mode" --steps "$STEPS" --ballast-gb "$BALLAST_GB")
    ref=$(env "${conf[@]}" CUDA_VISIBLE_DEVICES="$UUID" python3 "$HERE/capture.py" "${args[@]}" 2>"$WORK/ref.err" | tail -1)
    refsha=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["sha256"])' "$ref" 2>/dev/null)
    [ -n "$refsha" ] || { echo "FAIL $c: reference run: $(tail -5 "$WORK/ref.err")"; fails=$((fails + 1)); continue; }
    stop_sched
    "$SCHED" --socket-dir "$WORK" --gpu "$UUID:500ms::$((BUDGET_GB << 30)):Auto" 2>>"$WORK/sched.log" &
    SPID=$!
    for _ in $(seq 100); do [ -S "$WORK/$UUID.sock" ] && break; sleep 0.05; done
    pids=()
    rm -rf "$WORK/barrier" && mkdir -p "$WORK/barrier"
    for p in 1 2; do
        env "${conf[@]}" CUDA_VISIBLE_DEVICES="$UUID" LD_PRELOAD="$SHIM" GPUSHARE_SOCKET="$WORK/$UUID.sock" \
            GPUSHARE_GPU_UUID="$UUID" GPUSHARE_OVERSUB=1 GPUSHARE_LOG_LEVEL=info \
            timeout 400 python3 "$HERE/capture.py" "${args[@]}" --barrier "$WORK/barrier" --procs 2 >"$WORK/p$p.out" 2>"$WORK/p$p.err" &
        pids+=($!)
    done
    for p in 1 2; do wait "${pids[$((p - 1))]}"; echo $? >"$WORK/p$p.rc"; done
    for p in 1 2; do
        out=$(tail -1 "$WORK/p$p.out")
        sha=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["sha256"])' "$out" 2>/dev/null)
        bal=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["ballast_ok"])' "$out" 2>/dev/null)
        stats=$(grep -o "swap stats: out=[0-9]* ([0-9]* bytes) in=[0-9]* ([0-9]* bytes)" "$WORK/p$p.err" | tail -1)
        outs=$(sed -n 's/.*swap stats: out=\([0-9]*\).*/\1/p' "$WORK/p$p.err" | tail -1)
        bad=$(grep -c -e "error 90[01]" -e "StreamCapture" -e "capture.*invalid" "$WORK/p$p.err")
        line="$c process $p: rc=$(cat "$WORK/p$p.rc") sha256=${sha:-none} reference=$refsha equal=$([ "$sha" = "$refsha" ] && echo yes || echo no) ballast_ok=${bal:-?} ${stats:-no swap stats} capture_errors=$bad"
        if [ "$sha" = "$refsha" ] && [ "$bal" = True ] && [ "${outs:-0}" -gt 0 ] && [ "$bad" = 0 ]; then
            echo "PASS $line"
        else
            echo "FAIL $line"
            tail -20 "$WORK/p$p.err" | sed 's/^/    /'
            fails=$((fails + 1))
        fi
        grep -h -e "a stream captures" -e "out of memory" "$WORK/p$p.err" | sort | uniq -c | sed 's/^/    /'
    done
done
stop_sched
echo "scheduler: $(grep -h "^gpu " "$WORK/sched.log" | tail -1)"
echo "capture: $fails failure(s)"
[ "$fails" -eq 0 ]
