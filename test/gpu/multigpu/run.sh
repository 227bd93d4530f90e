#!/usr/bin/env bash
# Two data-parallel jobs (allreduce.py: two processes each, one per GPU, a matmul then an NCCL
# all-reduce per step) across the same two GPUs: each alone, the two in series, the two at once, and
# with SHIM=1 the two at once under the shim (LD_PRELOAD, one scheduler socket per GPU, the per-GPU
# variables as docs/deviceplugin.md's multi-GPU contract writes them). Every job runs in a session of
# its own (setsid), so under the standalone scheduler each job's clients on the two GPUs are one gang
# (docs/qos.md, Gangs): the SHIM=1 run fails unless the scheduler formed two gangs. Prints each job's
# time against alone and against the series, and checks every result bit-identical to the job's run
# alone. Each run is bounded by RUN_TIMEOUT: a deadlock shows as a timeout, never as a hang.
#   test/gpu/multigpu/run.sh                 (repository root; two GPUs; logs in $OUT, default /tmp/gpu-multigpu-out)
#   SHIM=1 test/gpu/multigpu/run.sh          (also under the shim; needs shim/build/libgpushare.so and
#                                             shim/build/gpushare-scheduler: go build -o shim/build/gpushare-scheduler ./cmd/gpushare-scheduler)
# Knobs: STEPS (400), SIZE (matmul side, 4096), ELEMS (all-reduce fp32 elements, 67108864), QUANTUM (50ms),
# RUN_TIMEOUT (120 s). The defaults keep the whole run under 9 minutes on two H200s.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
OUT=${OUT:-/tmp/gpu-multigpu-out}
mkdir -p "$OUT"
STEPS=${STEPS:-400}
SIZE=${SIZE:-4096}
ELEMS=${ELEMS:-67108864}
QUANTUM=${QUANTUM:-50ms}
RUN_TIMEOUT=${RUN_TIMEOUT:-120}
SHIM=${SHIM:-0}
BUILD=$ROOT/shim/build
PY=$ROOT/test/gpu/multigpu/allreduce.py
LOG=$OUT/run.log
exec > >(tee "$LOG") 2>&1
# NVLink multicast (NVLS) stays off: the machine's notes require it.
export NCCL_NVLS_ENABLE=0
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0,1}
REPRO="OUT=$OUT SHIM=$SHIM STEPS=$STEPS SIZE=$SIZE ELEMS=$ELEMS QUANTUM=$QUANTUM RUN_TIMEOUT=$RUN_TIMEOUT test/gpu/multigpu/run.sh"
echo "reproduce: $REPRO"
date -u +%FT%TZ
nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.used --format=csv
nvidia-smi topo -m || true
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'
[ "$(nvidia-smi -L | wc -l)" -ge 2 ] || { echo "FAIL: needs two GPUs"; exit 1; }
fails=0

# job NAME SEED PORT MODE: runs one job, its output in $OUT/MODE-NAME.log, in a session of its own:
# setsid -w waits for it and returns its status (timeout's 124 included); timeout, the session's
# leader, signals the whole job (its process group) when it runs past RUN_TIMEOUT.
job() {
    local name=$1 seed=$2 port=$3 mode=$4
    local envs=()
    [ "$mode" = shim ] && envs=("${SHIM_ENV[@]}")
    env "${envs[@]}" setsid -w timeout "$RUN_TIMEOUT" python3 "$PY" --job "$name" --seed "$seed" --port "$port" \
        --steps "$STEPS" --size "$SIZE" --elems "$ELEMS" >"$OUT/$mode-$name.log" 2>&1
}
# field MODE NAME KEY: the slower rank's seconds, or rank 0's digest, from a job's output.
field() {
    python3 - "$OUT/$1-$2.log" "$3" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
if len(rows) != 2:
    print(""); sys.exit()
print(max(r["seconds"] for r in rows) if sys.argv[2] == "seconds" else "/".join(sorted(r["sha256"] for r in rows)))
PY
}
# run MODE NAME...: the jobs at once; a job that did not finish in time fails.
run() {
    local mode=$1; shift
    local pids=() i=0 t0 t1
    t0=$(date +%s.%N)
    for name in "$@"; do
        job "$name" "$([ "$name" = a ] && echo 1 || echo 2)" $((29511 + i)) "$mode" &
        pids+=($!); i=$((i + 1))
    done
    local rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    t1=$(date +%s.%N)
    echo "$mode ($*): wall $(python3 -c "print(round($t1 - $t0, 1))") s, rc $rc"
    [ "$rc" = 124 ] && { echo "FAIL $mode: a job ran past ${RUN_TIMEOUT}s (deadlock?)"; fails=$((fails + 1)); }
}

echo "== alone"
run alone a
run alone b
echo "== serial (a then b)"
run serial a
run serial b
echo "== concurrent"
run concurrent a b
MODES=(serial concurrent)
if [ "$SHIM" = 1 ]; then
    [ -f "$BUILD/libgpushare.so" ] || make -s -C "$ROOT/shim" all || exit 1
    [ -x "$BUILD/gpushare-scheduler" ] || { echo "FAIL: missing $BUILD/gpushare-scheduler"; exit 1; }
    mapfile -t UUIDS < <(nvidia-smi --query-gpu=uuid --format=csv,noheader -i "$CUDA_VISIBLE_DEVICES" | tr -d ' ')
    SOCK_DIR=$(mktemp -d)
    # One scheduler for both GPUs: its gangs span them (a job's clients of one session, --gangs).
    "$BUILD/gpushare-scheduler" --socket-dir "$SOCK_DIR" --gpu "${UUIDS[0]}:$QUANTUM" --gpu "${UUIDS[1]}:$QUANTUM" --gangs -v 1 2>"$OUT/scheduler.log" &
    SPID=$!
    trap 'kill $SPID 2>/dev/null' EXIT
    for _ in $(seq 100); do [ -S "$SOCK_DIR/${UUIDS[1]}.sock" ] && break; sleep 0.05; done
    # The container environment of a pod with shim shares of both GPUs (docs/deviceplugin.md).
    SHIM_ENV=(LD_PRELOAD="$BUILD/libgpushare.so" GPUSHARE_GPU_UUID="${UUIDS[0]},${UUIDS[1]}"
        GPUSHARE_SOCKET="${UUIDS[0]}=$SOCK_DIR/${UUIDS[0]}.sock,${UUIDS[1]}=$SOCK_DIR/${UUIDS[1]}.sock"
        GPUSHARE_OVERSUB="${UUIDS[0]}=0,${UUIDS[1]}=0" GPUSHARE_LOG_LEVEL=info)
    echo "== concurrent under the shim"
    run shim a b
    MODES+=(shim)
    # The scheduler logs each gang as it forms and, as its last member leaves, its turns and waits.
    kill -INT "$SPID"; wait "$SPID"
    echo "== gangs (scheduler.log)"
    grep -h 'Gang formed\|Gang dissolved' "$OUT/scheduler.log"
    gangs=$(grep -c 'Gang formed' "$OUT/scheduler.log")
    if [ "$gangs" -ge 2 ]; then echo "PASS shim: $gangs gangs formed (one per job)"; else
        echo "FAIL shim: $gangs gangs formed, want one per job (2)"; fails=$((fails + 1)); fi
fi

echo "== results (seconds of the slower rank, first step excluded)"
serial_total=$(python3 -c "print($(field serial a seconds) + $(field serial b seconds))" 2>/dev/null || echo "")
printf '%-10s %-4s %8s %8s %10s %12s %s\n' mode job seconds alone x-alone x-serial digest
for mode in "${MODES[@]}"; do
    for name in a b; do
        [ -f "$OUT/$mode-$name.log" ] || continue
        s=$(field "$mode" "$name" seconds)
        alone=$(field alone "$name" seconds)
        d=$(field "$mode" "$name" sha256)
        want=$(field alone "$name" sha256)
        ratio=$(python3 -c "print(round($s / $alone, 2))" 2>/dev/null || echo "-")
        vs_serial=$(python3 -c "print(round($s / $serial_total, 2))" 2>/dev/null || echo "-")
        printf '%-10s %-4s %8s %8s %10s %12s %s\n' "$mode" "$name" "${s:--}" "${alone:--}" "$ratio" "$vs_serial" "${d:0:12}"
        if [ -n "$d" ] && [ "$d" = "$want" ]; then echo "PASS $mode-$name bit-identical to alone"; else
            echo "FAIL $mode-$name: digest '$d' != alone '$want'"; fails=$((fails + 1)); fi
    done
done
[ "$SHIM" = 1 ] && { echo "== shim log lines (first 20)"; grep -h "gpushare" "$OUT"/shim-*.log | head -20; }
echo "x-serial: the job's time against the two jobs run one after the other (a + b); under 1 means running them together beat the series"
echo "reproduce: $REPRO"
echo "fails: $fails"
[ "$fails" = 0 ]
