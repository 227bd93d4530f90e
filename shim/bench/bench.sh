#!/usr/bin/env bash
# GPU benchmarks of the shim; run on a machine with a GPU, nvcc and a built
# gpushare-scheduler (go build -o shim/build/gpushare-scheduler ./cmd/gpushare-scheduler).
#   make -C shim bench                 (BENCH_N=100000 launches per run, BENCH_ROUNDS=5)
# Prints, each measured with and without the shim in this one run:
#   hook fast path  ns per cuLaunchKernel on the stub driver: without the shim, with it, and with a launch
#                   bound (GPUSHARE_PACE_OVERRIDE=64: the paced path, its events always complete)
#   launch tax      p50 of an empty-kernel launch call, baseline vs shim holding the lock
#   hand-off        scheduler release->grant latency, p50/p99 over BENCH_HANDOFFS hand-offs
#   idle release    time from a process's last GPU work to the lock reaching a waiter
#   memory limit    what GPUSHARE_MEMORY_LIMIT_BYTES adds to an allocation and its free (stub driver)
set -euo pipefail
SHIM_DIR=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$SHIM_DIR/build}
N=${BENCH_N:-100000}
HANDOFFS=${BENCH_HANDOFFS:-20000}
SCHED=${GPUSHARE_SCHEDULER:-$BUILD/gpushare-scheduler}
echo "reproduce: make -C shim bench BENCH_N=$N BENCH_ROUNDS=${BENCH_ROUNDS:-5} BENCH_HANDOFFS=$HANDOFFS   (from the repository root)"
[ -x "$SCHED" ] || { echo "bench: $SCHED missing: go build -o shim/build/gpushare-scheduler ./cmd/gpushare-scheduler" >&2; exit 1; }
make -s -C "$SHIM_DIR" SHIM_BUILD="$BUILD" testbins >/dev/null

# The hook's own fast-path cost, on the stub driver: no GPU, no driver noise.
HP=$(mktemp -d)
"$SCHED" --socket-dir "$HP" --gpu GPU-stub:10s:10s 2>/dev/null &
HPID=$!
for _ in $(seq 100); do [ -S "$HP/GPU-stub.sock" ] && break; sleep 0.05; done
echo "== hook fast path on the stub driver (lock held)"
hp_base=$(env LD_LIBRARY_PATH="$BUILD/stub" GPUSHARE_STUB_LAUNCH_US=0 "$BUILD/bench/hotpath_bench")
hp_shim=$(env LD_LIBRARY_PATH="$BUILD/stub" GPUSHARE_STUB_LAUNCH_US=0 LD_PRELOAD="$BUILD/libgpushare.so" \
    GPUSHARE_SOCKET="$HP/GPU-stub.sock" "$BUILD/bench/hotpath_bench")
hp_paced=$(env LD_LIBRARY_PATH="$BUILD/stub" GPUSHARE_STUB_LAUNCH_US=0 LD_PRELOAD="$BUILD/libgpushare.so" \
    GPUSHARE_SOCKET="$HP/GPU-stub.sock" GPUSHARE_PACE_OVERRIDE=64 "$BUILD/bench/hotpath_bench")
echo "without shim: $hp_base"
echo "with shim:    $hp_shim"
echo "with shim, launch bound 64: $hp_paced"
kill $HPID; wait $HPID 2>/dev/null || true; rm -rf "$HP"

# The memory limit's own cost per cuMemAlloc + cuMemFree pair, on the stub driver (no memory behind
# its addresses): the shim without and with a limit it never reaches, alternately.
echo "== memory limit, ns per cuMemAlloc + cuMemFree pair on the stub driver (without limit / with)"
for r in $(seq "${BENCH_ROUNDS:-5}"); do
    cc_env=(LD_LIBRARY_PATH="$BUILD/stub" GPUSHARE_STUB_ALLOC_NOMAP=1 LD_PRELOAD="$BUILD/libgpushare.so")
    u=$(env "${cc_env[@]}" "$BUILD/bench/cap_cost" 2>/dev/null)
    c=$(env "${cc_env[@]}" GPUSHARE_MEMORY_LIMIT_BYTES=$((64 << 30)) "$BUILD/bench/cap_cost" 2>/dev/null)
    echo "round $r: $u / $c"
done

command -v nvcc >/dev/null || { echo "bench: nvcc not found; the GPU benchmarks need a CUDA machine" >&2; exit 1; }
mkdir -p "$BUILD/bench"
nvcc -O2 -o "$BUILD/bench/launch_bench" "$SHIM_DIR/bench/launch_bench.cu" -lcuda
nvcc -O2 -o "$BUILD/bench/idle_client" "$SHIM_DIR/bench/idle_client.cu"

WORK=$(mktemp -d)
UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0 | tr -d ' ')
"$SCHED" --socket-dir "$WORK" --gpu "$UUID:10s:10s" 2>"$WORK/sched.log" &
SPID=$!
trap 'kill $SPID 2>/dev/null || true; wait $SPID 2>/dev/null || true; rm -rf "$WORK"' EXIT
for _ in $(seq 100); do [ -S "$WORK/$UUID.sock" ] && break; sleep 0.05; done
SHIM_ENV=(LD_PRELOAD="$BUILD/libgpushare.so" GPUSHARE_SOCKET="$WORK/$UUID.sock" GPUSHARE_GPU_UUID="$UUID")

p50() { sed -n "s/^$1: .*p50=\([0-9]*\)ns.*/\1/p"; }
median() { sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
ROUNDS=${BENCH_ROUNDS:-5}
echo "== launch tax (N=$N per run, $ROUNDS interleaved rounds, empty kernel, GPU $UUID)"
: >"$WORK/added_drv"; : >"$WORK/added_rt"; : >"$WORK/added_pass"
for round in $(seq "$ROUNDS"); do
    base=$("$BUILD/bench/launch_bench" "$N")
    shim=$(env "${SHIM_ENV[@]}" "$BUILD/bench/launch_bench" "$N")
    pass=$(env LD_PRELOAD="$BUILD/libgpushare.so" GPUSHARE_LOG_LEVEL=error "$BUILD/bench/launch_bench" "$N")
    echo "round $round baseline:      $(echo "$base" | tr '\n' ' ')"
    echo "round $round shim (locked): $(echo "$shim" | tr '\n' ' ')"
    echo "round $round shim (pass):   $(echo "$pass" | tr '\n' ' ')"
    echo $(($(echo "$shim" | p50 cuLaunchKernel) - $(echo "$base" | p50 cuLaunchKernel))) >>"$WORK/added_drv"
    echo $(($(echo "$shim" | p50 "runtime <<<>>>") - $(echo "$base" | p50 "runtime <<<>>>"))) >>"$WORK/added_rt"
    echo $(($(echo "$pass" | p50 cuLaunchKernel) - $(echo "$base" | p50 cuLaunchKernel))) >>"$WORK/added_pass"
done
echo "launch tax, median over rounds of (p50 with shim - p50 baseline):"
echo "  cuLaunchKernel, lock held:     $(median <"$WORK/added_drv") ns   (per round: $(tr '\n' ' ' <"$WORK/added_drv"))"
echo "  runtime <<<>>>, lock held:     $(median <"$WORK/added_rt") ns   (per round: $(tr '\n' ' ' <"$WORK/added_rt"))"
echo "  cuLaunchKernel, pass-through:  $(median <"$WORK/added_pass") ns   (per round: $(tr '\n' ' ' <"$WORK/added_pass"))"

echo "== hand-off latency (scheduler release -> grant, $HANDOFFS hand-offs)"
"$BUILD/tests/proto_peer" "$WORK/$UUID.sock" handoff "$HANDOFFS"

echo "== idle release (GPUSHARE_IDLE_MS=${GPUSHARE_IDLE_MS:-50}, default 50)"
for round in 1 2 3; do
    env "${SHIM_ENV[@]}" "$BUILD/bench/idle_client" 300 1500 >"$WORK/idle.out" &
    CPID=$!
    for _ in $(seq 400); do grep -q busy "$WORK/idle.out" && break; sleep 0.01; done
    grant=$("$BUILD/tests/proto_peer" "$WORK/$UUID.sock" waitgrant | sed -n 's/grant_ns=//p')
    wait $CPID
    last=$(sed -n 's/last_work_ns=//p' "$WORK/idle.out")
    echo "round $round idle release: lock reached the waiter $(((grant - last) / 1000)) us after the last GPU work"
done
kill -INT $SPID; wait $SPID || true
echo "== scheduler counters"
grep -E "^gpusharing_" "$WORK/sched.log" || true
