#!/usr/bin/env bash
# What the shim's memory limit and the claim ledger charge, on a GPU machine (the driver's real answers):
#   1. the ledger's context charge: a process with two extra contexts (cuCtxCreate) in an 8 GiB claim fills
#      what it is offered; with the scheduler reading NVML (--nvml) NVML's figure for it stays within the
#      claim; without (every process charged R) the same process is shown for reference;
#   2. an export of the process's own VMM handle imported again, the import mapped and the original released:
#      charged once (L/4 more fits), kept while the import holds it (L/2 + 1 MiB refused), given back after;
#   3. a handle exported by another process (passed through a Unix socket) imported and mapped: charged at
#      its size, kept when released while mapped, given back when unmapped;
#   4. cuMemAlloc of 2 MiB + 1 byte under a 1 GiB limit: 256 fit (whole 2 MiB granules);
#   5. without the shim: what the driver takes (cuMemGetInfo) for 256 allocations of several sizes, a
#      512 MiB malloc heap and arrays, beside what the shim charges for them; the shim's rule must not be
#      above the driver for allocations of a granule or more, nor more than a granule below.
# Prints one PASS/FAIL line per check and the figures; exit status 1 on any FAIL.
#
#   test/gpu/charges/run.sh [LOG]     (from the repository root)
# Needs: nvidia-smi, gcc, make; test/gpu/charges/bin/gpushare-scheduler, built where Go is and carried:
#   CGO_ENABLED=1 go build -o test/gpu/charges/bin/gpushare-scheduler ./cmd/gpushare-scheduler
# Knobs: CLAIM (bytes, default 8 GiB), RESERVE (default 768 MiB), LIM (the limit of 2-4, default 1 GiB).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
HERE=$ROOT/test/gpu/charges
SHIM=$ROOT/shim/build/libgpushare.so
CLAIM=${CLAIM:-$((8 << 30))}
RESERVE=${RESERVE:-$((768 << 20))}
LIM=${LIM:-$((1 << 30))}
[ $# -ge 1 ] && mkdir -p "$(dirname "$1")" && exec > >(tee "$1") 2>&1
make -s -C "$ROOT/shim" all >/dev/null || exit 1
WORK=$(mktemp -d)
gcc -std=gnu11 -O2 -Wall -D_GNU_SOURCE -I"$ROOT/shim/include" "$HERE/charges.c" -o "$WORK/charges" -ldl || exit 1
UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0)
fails=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }
SCHED=
trap '[ -n "$SCHED" ] && kill $SCHED 2>/dev/null; rm -rf "$WORK"' EXIT
echo "charges: $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i 0)"

# nvml_used PID: NVML's device memory of the process, in bytes
nvml_used() {
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits |
        awk -F', ' -v p="$1" '$1 == p {s += $2} END {printf "%d\n", s * 1048576}'
}
# scheduler DIR FLAGS...: the standalone scheduler with every client in one claim
scheduler() {
    local dir=$1
    shift
    mkdir -p "$dir"
    "$HERE/bin/gpushare-scheduler" --socket-dir "$dir" --gpu "$UUID:2s" --claim-memory "$CLAIM" \
        --context-reserve "$RESERVE" "$@" 2>"$dir/sched.log" &
    SCHED=$!
    for _ in $(seq 50); do [ -S "$dir/$UUID.sock" ] && return 0; sleep 0.1; done
    echo "the scheduler did not start: $(cat "$dir/sched.log")"
    return 1
}
# ctx_fill DIR: a process with two extra contexts fills what it is offered; prints "got nvml"
ctx_fill() {
    local dir=$1 out=$1/ctx.out
    mkfifo "$dir/ctx.in"
    env GPUSHARE_SOCKET="$dir/$UUID.sock" GPUSHARE_GPU_UUID="$UUID" GPUSHARE_MEMORY_LIMIT_BYTES="$CLAIM" \
        LD_PRELOAD="$SHIM" "$WORK/charges" ctx 2 <"$dir/ctx.in" >"$out" 2>"$dir/ctx.err" &
    local pid=$! fd
    trap '' PIPE # a client that died early must not take this function with it when told to end
    exec {fd}>"$dir/ctx.in"
    for _ in $(seq 600); do [ -s "$out" ] && break; sleep 0.1; done
    local used got
    used=$(nvml_used "$pid")
    got=$(sed -n 's/.*got=\([0-9]*\).*/\1/p' "$out")
    echo >&"$fd" 2>/dev/null
    exec {fd}>&-
    wait "$pid"
    if [ -z "$got" ]; then # say why on stderr (the log), for the next run
        echo "ctx gave no figure in 60 s; its stderr and the scheduler's log:" >&2
        tail -n 5 "$dir/ctx.err" "$dir/sched.log" >&2
    fi
    echo "${got:-?} ${used:-0}"
}

echo "== 1. a process with two extra contexts fills an 8 GiB claim (R=$RESERVE)"
scheduler "$WORK/s1" --nvml || exit 1
read -r got used < <(ctx_fill "$WORK/s1")
kill $SCHED; wait $SCHED 2>/dev/null; SCHED=
echo "with --nvml: allocated $got bytes, NVML $used bytes; $(grep -c 'larger CUDA context' "$WORK/s1/sched.log") context updates logged"
if [ "$got" != "?" ] && [ "$used" -gt 0 ] && [ "$used" -le "$CLAIM" ]; then
    pass "the ledger charges the contexts NVML counts: NVML $used bytes for a claim of $CLAIM"
else
    fail "context charge: allocated $got, NVML $used bytes for a claim of $CLAIM"
fi
scheduler "$WORK/s2" || exit 1
read -r got0 used0 < <(ctx_fill "$WORK/s2")
kill $SCHED; wait $SCHED 2>/dev/null; SCHED=
echo "reference, R per process (no --nvml): allocated $got0 bytes, NVML $used0 bytes for a claim of $CLAIM"

echo "== 2. an export of its own handle imported again (limit $LIM)"
out=$(GPUSHARE_MEMORY_LIMIT_BYTES=$LIM LD_PRELOAD="$SHIM" "$WORK/charges" import "$LIM" 2>&1 | grep -v ' warn: ')
echo "$out"
if grep -q "fits=0 over=2 again=0" <<<"$out"; then pass "an imported export is charged once and kept while the import holds it"; else fail "export and import: $out"; fi

echo "== 3. another process's handle imported and mapped (limit $LIM)"
out=$(GPUSHARE_MEMORY_LIMIT_BYTES=$LIM LD_PRELOAD="$SHIM" "$WORK/charges" foreign "$LIM" 2>&1 | grep -v ' warn: ')
echo "$out"
if grep -q "foreign over=2 released=2 unmapped=0" <<<"$out"; then pass "a foreign handle is charged where it is mapped, until unmapped"; else fail "foreign handle: $out"; fi

echo "== 4. cuMemAlloc of 2 MiB + 1 byte until refused (limit $LIM)"
out=$(GPUSHARE_MEMORY_LIMIT_BYTES=$LIM LD_PRELOAD="$SHIM" "$WORK/charges" gran 2>&1 | grep -v ' warn: ')
echo "$out"
want=$((LIM / (4 << 20)))
if grep -q "gran got=$want\$" <<<"$out"; then pass "$want allocations of 2 MiB + 1 byte fill $LIM"; else fail "granularity: $out, want $want"; fi

echo "== 5. what the driver takes, without the shim"
out=$("$WORK/charges" measure 2>&1)
echo "$out"
bad=$(awk '/^measure alloc-256x/ {
        split($2, a, "x"); size = a[2]; took = substr($3, 6); ch = substr($4, 9)
        if (size > 1048576 && (ch > took + 2097152 || took > ch + 16777216)) print $2
    }' <<<"$out")
if [ -z "$bad" ] && grep -q "alloc-256x2097153" <<<"$out"; then
    pass "the shim's charge for allocations above half a granule matches what the driver takes"
else
    fail "granule rule against the driver: ${bad:-no figures}"
fi

echo "$fails failure(s)"
[ "$fails" -eq 0 ]
