#!/usr/bin/env bash
# The claim ledger (protocol 6) on a GPU machine, through the standalone scheduler with every client in
# one claim (--claim-memory) and the shim, with PyTorch:
#   1. one process of an 8 GiB claim fills what mem_get_info offers to the last byte: NVML's figure for it
#      (contexts included) stays within the claim, and 64 MiB more are refused;
#   2. two processes of one 8 GiB claim, in both orders: (a) a fills what mem_get_info offers, then b
#      starts: b's CUDA context is refused before it exists (PyTorch reports out of memory at its first
#      CUDA call) and a keeps all it got; (b) both create their contexts first, then each fills what
#      mem_get_info offers: NVML's sum stays within the claim;
#   3. vectorAddMMAP's pattern (cuMemCreate, cuMemMap, cuMemRelease) under a 1 GiB limit without a
#      scheduler: the mapped memory stops at the limit.
# Prints one PASS/FAIL line per check and the figures; exit status 1 on any FAIL.
#
#   test/gpu/ledger/run.sh [LOG]     (from the repository root)
# Needs: nvidia-smi, python3 with torch, gcc; test/gpu/ledger/bin/gpushare-scheduler, built where Go is:
#   CGO_ENABLED=1 go build -o test/gpu/ledger/bin/gpushare-scheduler ./cmd/gpushare-scheduler
# Knobs: CLAIM (bytes, default 8 GiB), RESERVE (default 768 MiB, the agent's --context-reserve).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
HERE=$ROOT/test/gpu/ledger
SHIM=$ROOT/shim/build/libgpushare.so
CLAIM=${CLAIM:-$((8 << 30))}
RESERVE=${RESERVE:-$((768 << 20))}
[ $# -ge 1 ] && exec > >(tee "$1") 2>&1
make -s -C "$ROOT/shim" all >/dev/null || exit 1
WORK=$(mktemp -d)
UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0)
fails=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }
echo "ledger: $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i 0)" \
    "torch $(python3 -c 'import torch; print(torch.__version__, torch.version.cuda)')"
"$HERE/bin/gpushare-scheduler" --socket-dir "$WORK" --gpu "$UUID:2s" --claim-memory "$CLAIM" --context-reserve "$RESERVE" \
    2>"$WORK/sched.log" &
SCHED=$!
trap 'kill $SCHED 2>/dev/null; for p in $(jobs -p); do kill $p 2>/dev/null; done; rm -rf "$WORK"' EXIT
for _ in $(seq 50); do [ -S "$WORK/$UUID.sock" ] && break; sleep 0.1; done
SOCK=$(ls "$WORK"/*.sock 2>/dev/null | head -1)
[ -S "$SOCK" ] || { echo "FAIL the scheduler did not start: $(cat "$WORK/sched.log")"; exit 1; }

# nvml_used PID...: NVML's per-process device memory of these pids together, in bytes
nvml_used() {
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits |
        awk -F', ' -v pids=" $* " 'index(pids, " " $1 " ") {s += $2} END {printf "%d\n", s * 1048576}'
}
# start NAME MODE ENV...: a workload on a fifo for its stdin; its JSON line in $WORK/NAME.out
start() {
    local name=$1 mode=$2
    shift 2
    mkfifo "$WORK/$name.in"
    env GPUSHARE_SOCKET="$SOCK" GPUSHARE_GPU_UUID="$UUID" GPUSHARE_MEMORY_LIMIT_BYTES="$CLAIM" "$@" LD_PRELOAD="$SHIM" \
        python3 "$HERE/workload.py" "$mode" <"$WORK/$name.in" >"$WORK/$name.out" 2>"$WORK/$name.err" &
    eval "PID_$name=$!"
    exec {fd}>"$WORK/$name.in"
    eval "FD_$name=$fd"
    for _ in $(seq 600); do [ -s "$WORK/$name.out" ] && return 0; sleep 0.1; done
    echo "$name did not finish: $(tail -5 "$WORK/$name.err")"
    return 1
}
# finish NAME: let the workload exit and wait for it (not for the scheduler, also a child)
finish() { local v="FD_$1" p="PID_$1" fd; fd=${!v}; echo >&"$fd"; exec {fd}>&-; wait "${!p}"; }
# fill_now NAME: let a ready-fill workload fill, and wait for its second line
fill_now() {
    local v="FD_$1" fd
    fd=${!v}
    echo >&"$fd"
    for _ in $(seq 600); do [ "$(wc -l <"$WORK/$1.out")" -ge 2 ] && return 0; sleep 0.1; done
    echo "$1 did not fill: $(tail -5 "$WORK/$1.err")"
    return 1
}
# field NAME KEY: KEY of the workload's last JSON line
field() { python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1]).get(sys.argv[2], '?'))" "$WORK/$1.out" "$2"; }

echo "== 1. one process fills its claim (M=$CLAIM, R=$RESERVE)"
start one fill
used=$(nvml_used "$(field one pid)")
echo "mem_get_info free=$(field one free) total=$(field one total) got=$(field one got) over_refused=$(field one over_refused) nvml=$used"
if [ "$(field one got)" = "$(field one free)" ] && [ "$(field one over_refused)" = True ] && [ "$used" -le "$CLAIM" ]; then
    pass "a process that fills what mem_get_info offers holds $used bytes by NVML, within the claim of $CLAIM"
else
    fail "one process: NVML $used bytes for a claim of $CLAIM"
fi
finish one

echo "== 2a. a fills the claim, then b starts"
start a fill && start b fill
used=$(nvml_used "$(field a pid)" "$(field b pid)")
echo "a: free=$(field a free) got=$(field a got) over_refused=$(field a over_refused); b: ctx_refused=$(field b ctx_refused)" \
    "error=$(field b error); nvml sum=$used"
if [ "$(field b ctx_refused)" = True ] && [ "$(field a got)" = "$(field a free)" ] && [ "$used" -le "$CLAIM" ]; then
    pass "a process that starts in a full claim is refused its context (out of memory, reported); the other keeps $(field a got) bytes, $used by NVML"
else
    fail "a full claim, then a second process: b ctx_refused=$(field b ctx_refused), NVML $used bytes for a claim of $CLAIM"
fi
finish a
finish b

echo "== 2b. a and b create their contexts, then each fills"
start a2 ready-fill && start b2 ready-fill && fill_now a2 && fill_now b2
used=$(nvml_used "$(field a2 pid)" "$(field b2 pid)")
echo "a: free=$(field a2 free) total=$(field a2 total) got=$(field a2 got); b: free=$(field b2 free) got=$(field b2 got)" \
    "over_refused=$(field b2 over_refused); nvml sum=$used"
if [ "$used" -le "$CLAIM" ] && [ "$(field a2 ctx_refused)" = False ] && [ "$(field b2 ctx_refused)" = False ] &&
    [ "$(field b2 over_refused)" = True ]; then
    pass "two processes of one claim started together hold $used bytes together by NVML, within the claim of $CLAIM"
else
    fail "two processes started together: NVML $used bytes together for a claim of $CLAIM"
fi
finish a2
finish b2

echo "== 3. vectorAddMMAP's pattern under a 1 GiB limit"
LIM=$((1 << 30))
mkfifo "$WORK/vmm.in"
GPUSHARE_MEMORY_LIMIT_BYTES=$LIM LD_PRELOAD="$SHIM" python3 "$HERE/workload.py" vmm <"$WORK/vmm.in" >"$WORK/vmm.out" 2>"$WORK/vmm.err" &
exec {vfd}>"$WORK/vmm.in"
for _ in $(seq 300); do [ -s "$WORK/vmm.out" ] && break; sleep 0.1; done
mapped=$(field vmm mapped_bytes 2>/dev/null || echo "?")
echo "mapped=$mapped pieces=$(field vmm pieces 2>/dev/null) refused=$(field vmm refused 2>/dev/null) $(tail -2 "$WORK/vmm.err")"
if [ "$mapped" != "?" ] && [ "$mapped" -le "$LIM" ] && [ "$(field vmm refused)" = True ]; then
    pass "create/map/release stops at the limit: $mapped bytes mapped under $LIM"
else
    fail "VMM pattern: $mapped bytes mapped under a limit of $LIM"
fi
echo >&$vfd
exec {vfd}>&-
wait "$!" 2>/dev/null
echo "scheduler log:"; grep -i -e ledger -e claim "$WORK/sched.log" | tail -5
[ "$fails" = 0 ]
