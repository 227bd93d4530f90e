#!/usr/bin/env bash
# CPU-only checks of libgpushare.so against the stub driver; the scheduler
# integration tests live in agent/scheduler (go test). Run via `make -C shim test`.
set -euo pipefail
BUILD=${BUILD:-$(cd "$(dirname "$0")/.." && pwd)/build}
SHIM=$BUILD/libgpushare.so
CLIENT=$BUILD/tests/client
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
# The protocol the shim speaks, and the HELLOs it sends a scheduler of protocol $1: each newer version
# three times (a close at a HELLO is taken for a refusal only when it comes again), then $1's.
PROTO=$(sed -n 's/^#define GS_PROTO_VERSION \([0-9]*\)u$/\1/p' "$(dirname "$0")/../include/gpushare_proto.h")
want_hellos() {
    local v out=""
    for ((v = PROTO; v > $1; v--)); do
        out+="got HELLO version=$v refused HELLO version=$v got HELLO version=$v refused HELLO version=$v "
        out+="got HELLO version=$v refused HELLO version=$v "
    done
    echo "${out}got HELLO version=$1 "
}
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; fails=$((fails + 1)); }

run_client() { # env... -- args: runs the client under the shim with the stub driver
    env LD_LIBRARY_PATH="$BUILD/stub" LD_PRELOAD="$SHIM" GPUSHARE_STUB_LAUNCH_US=10 "$@"
}

# 1. Only CUDA entry points, NVML's two memory queries and dlsym leave the library.
exported=$(nm -D --defined-only "$SHIM" | awk '{print $3}')
extra=$(grep -v -e '^cu' -e '^dlsym$' -e '^nvmlDeviceGetMemoryInfo$' -e '^nvmlDeviceGetMemoryInfo_v2$' <<<"$exported" || true)
if [ -z "$extra" ]; then pass "exports only cu*, NVML's memory queries and dlsym"; else fail "exports only cu*, NVML's memory queries and dlsym" "also exports: $extra"; fi
for sym in cuLaunchKernel cuLaunchKernelEx cuGraphLaunch cuMemAlloc_v2 cuMemAllocAsync cuMemcpyHtoDAsync_v2_ptsz cuGetProcAddress_v2 dlsym nvmlDeviceGetMemoryInfo_v2; do
    grep -qx "$sym" <<<"$exported" || fail "exports $sym" "missing"
done

# 2. Every way of reaching cuLaunchKernel lands in the hook (counted at debug level).
for mode in dlsym procaddr procaddr_v1 ptsz; do
    want=cuLaunchKernel
    [ "$mode" = ptsz ] && want=cuLaunchKernel_ptsz
    out=$(run_client GPUSHARE_LOG_LEVEL=debug "$CLIENT" "$mode" 7 2>&1) || { fail "hook via $mode" "client failed: $out"; continue; }
    if grep -q "calls $want=7\$" <<<"$out" && grep -q "calls cuMemAlloc_v2=1\$" <<<"$out"; then
        pass "launch and alloc reach the hook via $mode"
    else
        fail "hook via $mode" "$out"
    fi
done

# 3. No scheduler configured: pass-through, exactly one warning.
out=$(run_client "$CLIENT" dlsym 5 2>&1)
n=$(grep -c "GPU lock disabled" <<<"$out" || true)
if grep -q "client done" <<<"$out" && [ "$n" = 1 ]; then pass "unset GPUSHARE_SOCKET passes through with one warning"; else fail "unset socket" "$out"; fi

# 3b. A memory limit and no scheduler (a sized claim on an MPS GPU): the limit alone, said at info level,
# no warning; a socket that fails still warns.
out=$(run_client GPUSHARE_MEMORY_LIMIT_BYTES=$((64 << 20)) GPUSHARE_LOG_LEVEL=info "$CLIENT" dlsym 5 2>&1)
if grep -q "client done" <<<"$out" && ! grep -q "GPU lock disabled" <<<"$out" && grep -q "GPUSHARE_MEMORY_LIMIT_BYTES alone is in force" <<<"$out"; then
    pass "a memory limit without GPUSHARE_SOCKET runs the limit alone without a warning"
else
    fail "limit without socket" "$out"
fi
out=$(run_client GPUSHARE_MEMORY_LIMIT_BYTES=$((64 << 20)) GPUSHARE_SOCKET="$TMP/nothing.sock" timeout 10 "$CLIENT" dlsym 5 2>&1)
n=$(grep -c "cannot reach the GPU scheduler" <<<"$out" || true)
if grep -q "client done" <<<"$out" && [ "$n" = 1 ]; then pass "a memory limit with a missing scheduler still warns once"; else fail "limit with missing scheduler" "$out"; fi

# 4. A socket path with nothing behind it: the process runs without the lock, with one warning that it
# keeps trying, no hang, and its exit is not held up by the attempts.
start=$(date +%s%N)
out=$(run_client GPUSHARE_SOCKET="$TMP/nothing.sock" timeout 10 "$CLIENT" procaddr 50 2>&1)
ms=$((($(date +%s%N) - start) / 1000000))
n=$(grep -c "cannot reach the GPU scheduler at $TMP/nothing.sock: running without the GPU lock until it answers" <<<"$out" || true)
if grep -q "client done" <<<"$out" && [ "$n" = 1 ] && ! grep -q "GPU lock disabled" <<<"$out" && [ "$ms" -lt 3000 ]; then
    pass "missing scheduler: runs without the lock, one warning, tries again (${ms} ms)"
else
    fail "missing scheduler" "took ${ms} ms: $out"
fi

# 5. A path that is not a socket: the same (the agent may yet put its socket there). An over-long path
# can never be connected to: pass-through for good, one warning.
: >"$TMP/regular-file"
out=$(run_client GPUSHARE_SOCKET="$TMP/regular-file" timeout 10 "$CLIENT" dlsym 5 2>&1)
n=$(grep -c "cannot reach the GPU scheduler" <<<"$out" || true)
if grep -q "client done" <<<"$out" && [ "$n" = 1 ]; then pass "a socket path that is a regular file: runs, tries again"; else fail "regular-file socket" "$out"; fi
out=$(run_client GPUSHARE_SOCKET="/$(printf 'x%.0s' {1..200})" timeout 10 "$CLIENT" dlsym 5 2>&1)
n=$(grep -c "GPU lock disabled" <<<"$out" || true)
if grep -q "client done" <<<"$out" && [ "$n" = 1 ]; then pass "an over-long socket path passes through"; else fail "over-long socket path" "$out"; fi

# 6. A process that never touches CUDA never loads the driver and never warns.
if command -v python3 >/dev/null; then # Python resolves every extension module through dlsym
    out=$(env LD_PRELOAD="$SHIM" GPUSHARE_SOCKET="$TMP/nothing.sock" python3 -c 'import ctypes, json; print("ok")' 2>&1 || true)
    if [ "$out" = "ok" ]; then pass "non-CUDA process is untouched"; else fail "non-CUDA process" "$out"; fi
else
    echo "SKIP non-CUDA process check: no python3"
fi

# 7. dlsym(RTLD_NEXT) keeps its meaning for callers other than the shim.
cat >"$TMP/next.c" <<'C'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
int main(void) {
    size_t (*real_strlen)(const char *) = (size_t (*)(const char *))dlsym(RTLD_NEXT, "strlen");
    if (!real_strlen || real_strlen("four") != 4) { puts("bad"); return 1; }
    puts("ok");
    return 0;
}
C
if ${CC:-gcc} -o "$TMP/next" "$TMP/next.c" -ldl && [ "$(LD_PRELOAD="$SHIM" "$TMP/next")" = ok ]; then
    pass "dlsym(RTLD_NEXT) resolves past the caller"
else
    fail "dlsym(RTLD_NEXT)" "did not resolve"
fi

# 8. Without a driver loaded, our own exports do not make CUDA look present.
cat >"$TMP/probe.c" <<'C'
#include <dlfcn.h>
#include <stdio.h>
int main(void) {
    puts(dlsym(RTLD_DEFAULT, "cuLaunchKernel") || dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2") ||
         dlsym(RTLD_DEFAULT, "nvmlDeviceGetMemoryInfo") ? "found" : "absent");
    return 0;
}
C
if ${CC:-gcc} -o "$TMP/probe" "$TMP/probe.c" -ldl && [ "$(GPUSHARE_MEMORY_LIMIT_BYTES=1048576 LD_PRELOAD="$SHIM" "$TMP/probe")" = absent ]; then
    pass "no driver, no cu* or NVML symbols from dlsym(RTLD_DEFAULT)"
else
    fail "dlsym(RTLD_DEFAULT) without a driver" "the shim's own exports were handed out"
fi

# 9. Oversubscription asked for but no scheduler: plain driver memory, the data intact, one warning
# (which says oversubscription stays off: a scheduler that answers later cannot swap plain memory).
out=$(run_client GPUSHARE_OVERSUB=1 GPUSHARE_SOCKET="$TMP/nothing.sock" "$BUILD/tests/oversub_client" bufs=2 size=2097152 iters=200 2>&1)
n=$(grep -c "running without the GPU lock and without oversubscription until it answers" <<<"$out" || true)
if grep -q "oversub done.*total=85899345920 ipc=0" <<<"$out" && [ "$n" = 1 ]; then
    pass "GPUSHARE_OVERSUB=1 without a scheduler passes through to plain memory"
else
    fail "oversub without scheduler" "$out"
fi

# (the stub's own pool counts nothing, so only the VMM answers are checked)
for kind in async vmm; do
    out=$(run_client GPUSHARE_OVERSUB=1 GPUSHARE_SOCKET="$TMP/nothing.sock" "$BUILD/tests/oversub_client" alloc=$kind bufs=2 size=4194304 iters=200 2>&1)
    want="kind_ok=1 churned=[1-9]"
    [ "$kind" = async ] && want="churned=[1-9]"
    if grep -q "oversub done.*total=85899345920.*$want" <<<"$out"; then
        pass "GPUSHARE_OVERSUB=1 without a scheduler: alloc=$kind passes through to the driver"
    else
        fail "oversub alloc=$kind without scheduler" "$out"
    fi
done

# --- With a (fake) scheduler granting a budget: oversubscription on ---
wait_for() { # SECONDS CMD...: until CMD succeeds; 1 after SECONDS
    local end=$(($(date +%s) + $1))
    shift
    until "$@"; do
        [ "$(date +%s)" -ge "$end" ] && return 1
        sleep 0.02
    done
}
start_fake() { # DIR args...: the scripted scheduler on DIR/s.sock, its log in DIR/sched.log
    local d=$1
    shift
    "$BUILD/tests/fake_sched" "$d/s.sock" "$@" >"$d/sched.log" 2>&1 &
    FAKE=$!
    wait_for 5 test -S "$d/s.sock"
}
stop_fake() { kill "$FAKE" 2>/dev/null; wait "$FAKE" 2>/dev/null || true; }

# 10. Stream capture with oversubscription on: memory allocated during a global-mode capture (thread
# relaxed, as PyTorch's allocator does) gets host staging the stager must not page-lock until the
# capture ended (the stub refuses it and invalidates the capture, as the driver does); an eviction
# asked for during the capture waits for its end; the graph replays correctly after the swap.
D=$TMP/capture
mkdir -p "$D"
start_fake "$D" budget=268435456 revoke_file="$D/revoke"
run_client GPUSHARE_OVERSUB=1 GPUSHARE_SOCKET="$D/s.sock" GPUSHARE_LOG_LEVEL=debug GPUSHARE_STUB_TRACE="$D/trace" \
    "$BUILD/tests/capture_client" capture go="$D/go" swapped="$D/swapped" >"$D/out" 2>"$D/err" &
CPID=$!
stager_looked() { grep -q "page-locking host staging waits until the capture ends" "$D/err" || grep -q "^X " "$D/trace" 2>/dev/null; }
evict_looked() { grep -q "an eviction waits: a stream captures" "$D/err" || grep -q "^X " "$D/trace" 2>/dev/null; }
evicted() { grep -q "got USAGE reason=1 .* swapped=[1-9]" "$D/sched.log"; }
ok=1
wait_for 20 grep -q capturing "$D/out" && wait_for 20 stager_looked || ok=0
: >"$D/revoke"
wait_for 20 evict_looked || ok=0
early=$(grep -c "got USAGE reason=1" "$D/sched.log" || true)
: >"$D/go"
wait_for 20 evicted || ok=0
: >"$D/swapped"
wait "$CPID" || ok=0
x=$(grep -c "^X " "$D/trace" 2>/dev/null || true)
if [ "$ok" = 1 ] && [ "$x" = 0 ] && [ "$early" = 0 ] && grep -q "capture_end=0" "$D/out" && grep -q "replayed ok" "$D/out" &&
    grep -q "swap stats: out=[1-9].* in=[1-9].*staging pinned=[1-9]" "$D/err"; then
    pass "stream capture under oversubscription: nothing refused, eviction waited, replay after a swap intact"
else
    fail "capture under oversubscription" "x=$x early_evict=$early $(cat "$D/out") $(grep -e "^X " "$D/trace" | head -3) $(grep -e "swap stats" -e warn "$D/err" | head -5)"
fi
stop_fake

# 11. A thread waiting for the scheduler's answer to a memory request does not hold up the others:
# the fake scheduler holds one MEMREPLY back, and another thread's small allocation and frees finish
# while the request still waits.
D=$TMP/lock
mkdir -p "$D"
start_fake "$D" budget=1073741824 stall_above=33554432 memreq_file="$D/memreq" release_file="$D/release"
out=$(run_client GPUSHARE_OVERSUB=1 GPUSHARE_SOCKET="$D/s.sock" GPUSHARE_MEMREPLY_TIMEOUT_MS=3000 \
    timeout 30 "$BUILD/tests/capture_client" lock memreq="$D/memreq" release="$D/release" 2>&1)
if grep -q "big_pending=1" <<<"$out" && grep -q "big_alloc=0" <<<"$out" && grep -q "client exit=0" <<<"$out"; then
    pass "allocations and frees go on while another thread waits for the scheduler ($(grep -o "prompt_ms=[0-9]*" <<<"$out"))"
else
    fail "memory lock held across a scheduler wait" "$out"
fi
stop_fake

# 12. The memory limit (GPUSHARE_MEMORY_LIMIT_BYTES), every allocation path, no oversubscription: four
# allocations of a quarter fill it, the fifth and a 1 MiB cuMemAlloc fail with out of memory (2: the
# bytes are counted as the driver takes them, pitch * height for a pitched one), a free gives its
# bytes back; cuMemGetInfo reports the limit as the total and what it leaves as free.
LIM=67108864
for path in alloc pitch managed async pool vmm; do
    out=$(run_client GPUSHARE_MEMORY_LIMIT_BYTES=$LIM "$BUILD/tests/cap_client" $path $LIM 2>&1)
    if grep -q "cap $path fill=0,0,0,0 over=2 over_small=2 freed=0 again=0 total=$LIM free_full=0 free_empty=$LIM\$" <<<"$out"; then
        pass "memory limit: $path allocations stop at the limit, a free gives the bytes back, cuMemGetInfo reports it"
    else
        fail "memory limit on $path" "$out"
    fi
done

# A retained VMM handle keeps its charge until its last release; threads racing for the last bytes
# get exactly the limit between them, and give all of it back.
out=$(run_client GPUSHARE_MEMORY_LIMIT_BYTES=$LIM "$BUILD/tests/cap_client" retain $LIM 2>&1)
if grep -q "cap retain first=2 second=0" <<<"$out"; then pass "memory limit: a retained handle stays charged until its last release"; else fail "memory limit with a retained handle" "$out"; fi
# vectorAddMMAP's pattern: a handle released while mapped stays charged until its mapping goes (the
# mappings hold the limit: 4 of a quarter, not 12), and unmapping gives the charge back.
out=$(run_client GPUSHARE_MEMORY_LIMIT_BYTES=$LIM "$BUILD/tests/cap_client" mmap $LIM 2>&1)
if grep -q "cap mmap mapped=4 again=0" <<<"$out"; then pass "memory limit: a released but mapped handle stays charged until unmapped"; else fail "memory limit with create/map/release" "$out"; fi
out=$(run_client GPUSHARE_MEMORY_LIMIT_BYTES=$LIM "$BUILD/tests/cap_client" threads $LIM 2>&1)
if grep -q "cap threads got=64 free_after=$LIM\$" <<<"$out"; then pass "memory limit: 8 threads racing get exactly the limit"; else fail "memory limit under threads" "$out"; fi
# Ways past the limit that only NVML would see: an export of the process's own handle imported again is
# the same memory, charged once and kept while the import holds it; a handle the shim never saw is
# charged where it is mapped, kept when released while mapped, and refused past the limit; cuMemAlloc
# takes whole 2 MiB granules; the device malloc heap and arrays count.
out=$(run_client GPUSHARE_MEMORY_LIMIT_BYTES=$LIM "$BUILD/tests/cap_client" import $LIM 2>&1)
if grep -q "cap import fits=0 over=2 again=0" <<<"$out"; then pass "memory limit: an imported export of its own handle is charged once and kept while imported"; else fail "memory limit with export and import" "$out"; fi
# A seeded random mix of create, export and import, map, unmap, release and retain: after every step the
# limit charges exactly the allocations still alive (an import or a retain never twice, a release never
# what a mapping or another handle still holds, a released handle's value free for the driver to reuse),
# and nothing at the end. 20 seeds, with both kinds of retained handle value.
bad=""
for new in 0 1; do
    for seed in $(seq 1 20); do
        out=$(run_client GPUSHARE_MEMORY_LIMIT_BYTES=$LIM GPUSHARE_STUB_RETAIN_NEW=$new "$BUILD/tests/cap_client" vmmsteps $LIM $seed 2>&1)
        grep -q "cap vmmsteps steps=400 ok" <<<"$out" || bad="$bad seed=$seed retain_new=$new: $(grep 'cap vmmsteps' <<<"$out")"
    done
done
if [ -z "$bad" ]; then pass "memory limit: 40 random VMM call sequences charge exactly what is held at every step"; else fail "memory limit under random VMM calls" "$bad"; fi
for new in 0 1; do
    out=$(run_client GPUSHARE_MEMORY_LIMIT_BYTES=$LIM GPUSHARE_STUB_RETAIN_NEW=$new "$BUILD/tests/cap_client" held $LIM 2>&1)
    if grep -q "cap held held=2 gone=0" <<<"$out"; then pass "memory limit: a retained handle alone keeps the charge (retain gives a new value: $new)"; else fail "memory limit with a retained handle alone (new value: $new)" "$out"; fi
done
out=$(run_client GPUSHARE_MEMORY_LIMIT_BYTES=$LIM "$BUILD/tests/cap_client" unknown $LIM 2>&1)
if grep -q "cap unknown over=2 released=2 unmapped=0 big=2" <<<"$out"; then pass "memory limit: a handle the shim never saw is charged where it is mapped, kept until unmapped"; else fail "memory limit with an unknown handle" "$out"; fi
out=$(run_client GPUSHARE_MEMORY_LIMIT_BYTES=$LIM "$BUILD/tests/cap_client" gran $LIM 2>&1)
if grep -q "cap gran got=16\$" <<<"$out"; then pass "memory limit: cuMemAlloc of 2 MiB + 1 byte is charged 4 MiB (whole granules)"; else fail "memory limit at the driver's granularity" "$out"; fi
out=$(run_client GPUSHARE_MEMORY_LIMIT_BYTES=$LIM "$BUILD/tests/cap_client" heap $LIM 2>&1)
if grep -q "cap heap set=0 over=2 big=2 lowered=0 after=0" <<<"$out"; then pass "memory limit: the device malloc heap (cuCtxSetLimit) is charged"; else fail "memory limit with the malloc heap" "$out"; fi
out=$(run_client GPUSHARE_MEMORY_LIMIT_BYTES=$LIM "$BUILD/tests/cap_client" array $LIM 2>&1)
if grep -q "cap array made=0 over=2 freed=0 made3d=0 layered=2 mip=2" <<<"$out"; then pass "memory limit: arrays, layered and mipmapped arrays are charged their texels"; else fail "memory limit with arrays" "$out"; fi

# 13. The limit with oversubscription on. Below the budget it bounds what the process may allocate,
# every path (swappable memory, the shim's stream-ordered cache, the application's VMM handles);
# above the budget it loosens nothing: the working set still stops at the budget (the third
# allocation fails for the budget, with its own warning), and cuMemGetInfo reports the smaller.
D=$TMP/capover
mkdir -p "$D"
start_fake "$D" budget=1073741824
for path in alloc pitch async vmm; do
    out=$(run_client GPUSHARE_OVERSUB=1 GPUSHARE_SOCKET="$D/s.sock" GPUSHARE_LOG_LEVEL=info GPUSHARE_MEMORY_LIMIT_BYTES=$LIM \
        "$BUILD/tests/cap_client" $path $LIM 2>&1)
    if grep -q "cap $path fill=0,0,0,0 over=2 over_small=2 freed=0 again=0 total=$LIM free_full=0 free_empty=$LIM\$" <<<"$out" &&
        grep -q "oversubscription on: budget 1073741824" <<<"$out" && grep -q "process's memory limit of $LIM" <<<"$out"; then
        pass "memory limit below the oversubscription budget: $path stops at the limit"
    else
        fail "memory limit below the budget on $path" "$out"
    fi
done
stop_fake
D=$TMP/capover2 # a new socket path: start_fake waits for the socket file to appear
mkdir -p "$D"
start_fake "$D" budget=33554432
out=$(run_client GPUSHARE_OVERSUB=1 GPUSHARE_SOCKET="$D/s.sock" GPUSHARE_MEMORY_LIMIT_BYTES=$LIM \
    "$BUILD/tests/cap_client" alloc $LIM 2>&1)
if grep -q "cap alloc fill=0,0,2,2 over=2 over_small=2 freed=0 again=0 total=33554432 free_full=0 free_empty=33554432\$" <<<"$out" &&
    grep -q "more than this process's budget of 33554432" <<<"$out" && ! grep -q "process's memory limit" <<<"$out"; then
    pass "memory limit above the oversubscription budget: the budget still stops the working set"
else
    fail "memory limit above the budget" "$out"
fi
stop_fake

# 14. A malformed limit is ignored with one warning: no limit, the driver's answers.
out=$(run_client GPUSHARE_MEMORY_LIMIT_BYTES=8Gi "$BUILD/tests/cap_client" alloc $LIM 2>&1)
n=$(grep -c "ignoring GPUSHARE_MEMORY_LIMIT_BYTES=8Gi" <<<"$out" || true)
if [ "$n" = 1 ] && grep -q "cap alloc fill=0,0,0,0 over=0 over_small=0 freed=0 again=0 total=85899345920 " <<<"$out"; then
    pass "a malformed memory limit is ignored with one warning"
else
    fail "malformed memory limit" "$out"
fi

# 15. NVML's memory queries report the limit (v1 and v2 through dlsym, v1 through a direct link):
# total the limit, used what this process allocated (16 MiB), free the rest; NVML's own numbers
# without a limit.
want="nvml v1 $LIM/50331648/16777216 v2 $LIM/50331648/16777216 direct $LIM/50331648/16777216"
out=$(run_client GPUSHARE_MEMORY_LIMIT_BYTES=$LIM "$BUILD/tests/nvml_client" 2>&1)
if grep -qx "$want" <<<"$out"; then pass "NVML reports the memory limit (dlsym v1, v2, direct link)"; else fail "NVML under the limit" "$out"; fi
out=$(run_client "$BUILD/tests/nvml_client" 2>&1)
if grep -qx "nvml v1 85899345920/75161927680/10737418240 v2 85899345920/75161927680/9663676416 direct 85899345920/75161927680/10737418240" <<<"$out"; then
    pass "NVML untouched without a limit"
else
    fail "NVML without a limit" "$out"
fi

# --- Launch pacing: a bound on the launches a process keeps outstanding (PACE, protocol 4) ---
# The stub's "GPU" is held (GPUSHARE_STUB_RUN_FILE: how many launches it may run in all), so a test
# sees where the shim makes the launching thread wait: the stub traces each launch when it is made
# (Q), each launch run (E), each event record (R) and the first poll that finds a record not done (W).
launches_made() { grep -c -E '^Q [0-9]+ [0-9]+ cu(Launch|GraphLaunch)' "$1" 2>/dev/null || true; }
polls_waiting() { grep -c '^W ' "$1" 2>/dev/null || true; }
max_outstanding() { # the most launches made and not yet run at any moment of TRACE
    awk '$1 == "Q" && $4 ~ /^cu(Launch|GraphLaunch)/ {q++; if (q - e > m) m = q - e} $1 == "E" {e++} END {print m + 0}' "$1"
}
launch_ns() { # TRACE N: when the N-th launch was made (monotonic ns)
    awk -v n="$2" '$1 == "Q" && $4 ~ /^cu(Launch|GraphLaunch)/ && ++k == n {print $3; exit}' "$1"
}
waits_at() { # TRACE N K: the launching thread polls a record not done (the K-th time) with exactly N launches made
    [ "$(polls_waiting "$1")" -ge "$3" ] && [ "$(launches_made "$1")" = "$2" ]
}
run_paced() { # DIR [VAR=VALUE...] COMMAND...: COMMAND in the background, the GPU held; DIR/out, DIR/err
    local d=$1 vars=()
    shift
    while [[ "$1" == *=* ]]; do
        vars+=("$1")
        shift
    done
    echo 0 >"$d/run"
    : >"$d/trace"
    : >"$d/out" # before the background job opens them, so that a test's first look finds them
    : >"$d/err"
    # Launches of 100 us: each counts as a whole launch (GPUSHARE_PACE_FULL_US's default) once timed. An
    # idle window of 10 minutes: a release for idleness drains the GPU, which the test holds, so a client
    # that a loaded machine deschedules between two launches would stop where no bound stops it.
    run_client GPUSHARE_STUB_RUN_FILE="$d/run" GPUSHARE_STUB_TRACE="$d/trace" GPUSHARE_LOG_LEVEL=info \
        GPUSHARE_PACE_WAIT_MAX_MS=60000 GPUSHARE_STUB_LAUNCH_US=100 GPUSHARE_IDLE_MS=600000 "${vars[@]}" \
        timeout 60 "$@" >"$d/out" 2>"$d/err" &
    PC=$!
}
finish_paced() { # DIR: lets the GPU run everything; the client's exit status
    echo 1000000 >"$1/run"
    wait "$PC"
}
PACE=$BUILD/tests/pace_client

# 16. The scheduler's bound (PACE 8, protocol 4) on every launch entry point: the launching thread
# stops with 8 launches outstanding, goes on as work completes (4 run: 4 more made), never more than 8;
# its events go to the launch's stream (the per-thread stream for a _ptsz variant's default stream).
D=$TMP/pace
mkdir -p "$D"
start_fake "$D" pace=8
for entry in kernel kernel_ptsz ex ex_ptsz coop coop_ptsz grid_async graph graph_ptsz; do
    run_paced "$D" GPUSHARE_SOCKET="$D/s.sock" "$PACE" launch $entry 32
    ok=1
    wait_for 20 waits_at "$D/trace" 8 1 || ok=0
    echo 4 >"$D/run"
    wait_for 20 waits_at "$D/trace" 12 2 || ok=0
    finish_paced "$D" || ok=0
    m=$(max_outstanding "$D/trace")
    want=0
    [[ $entry == *_ptsz ]] && want=0x2
    streams=$(awk '$1 == "R" {print $4}' "$D/trace" | sort -u | tr '\n' ' ')
    if [ "$ok" = 1 ] && [ "$m" = 8 ] && grep -q "client done" "$D/out" && [ "$streams" = "stream=$want " ] &&
        grep -q "at most 8 launches outstanding (the GPU scheduler's bound)" "$D/err" &&
        grep -q "launch pacing: 32 launches paced, [1-9][0-9]* waited" "$D/err"; then
        pass "PACE 8: $entry stops at 8 launches outstanding and goes on as they complete"
    else
        fail "PACE 8 on $entry" "ok=$ok max=$m made=$(launches_made "$D/trace") records on $streams $(cat "$D/out" "$D/err")"
    fi
done
for entry in kernel ex graph; do # on a stream of the application's
    out=$(run_client GPUSHARE_SOCKET="$D/s.sock" GPUSHARE_STUB_TRACE="$D/trace.$entry" PACE_CLIENT_STREAM=5100 \
        timeout 20 "$PACE" launch $entry 16 2>&1 || true)
    streams=$(awk '$1 == "R" {print $4}' "$D/trace.$entry" | sort -u | tr '\n' ' ')
    if grep -q "client done" <<<"$out" && [ "$streams" = "stream=0x5100 " ]; then
        pass "PACE 8: $entry on an application's stream records there"
    else
        fail "PACE 8 on $entry on a stream" "records on $streams $out"
    fi
done
if grep -q "got HELLO version=7" "$D/sched.log" && ! grep -q "refused HELLO" "$D/sched.log"; then
    pass "the shim says HELLO in protocol 7"
else
    fail "protocol 7 HELLO" "$(cat "$D/sched.log")"
fi
stop_fake

# 17. PACE 0 lifts the bound: the thread waiting at 4 goes on, and all 64 launches are made while none ran.
D=$TMP/unpace
mkdir -p "$D"
start_fake "$D" pace=4 pace_file="$D/unpace" pace_next=0
run_paced "$D" GPUSHARE_SOCKET="$D/s.sock" "$PACE" launch kernel 64
ok=1
wait_for 20 waits_at "$D/trace" 4 1 || ok=0
: >"$D/unpace"
wait_for 20 grep -q "launched 64" "$D/out" || ok=0
finish_paced "$D" || ok=0
m=$(max_outstanding "$D/trace")
if [ "$ok" = 1 ] && [ "$m" = 64 ] && grep -q "client done" "$D/out" && grep -q "launch pacing: unbounded" "$D/err"; then
    pass "PACE 0 after PACE 4 lets the waiting thread go on, unbounded"
else
    fail "PACE 0" "ok=$ok max=$m $(cat "$D/out" "$D/err")"
fi
stop_fake

# 17b. A thread waiting for its bound is inside a GPU call, however long it goes without running: under
# PACE 8 with the GPU held and a 50 ms idle window, a waiting thread whose every event query takes 100 ms
# (GPUSHARE_STUB_QUERY_US: a starved CPU) keeps the lock through three of them (P lines in the trace)
# and goes on as work completes (8 more launches) without a RELEASE; a release for idleness there would
# drain the held GPU and hand it over mid-step.
D=$TMP/paceidle
mkdir -p "$D"
start_fake "$D" pace=8
run_paced "$D" GPUSHARE_SOCKET="$D/s.sock" GPUSHARE_IDLE_MS=50 GPUSHARE_STUB_QUERY_US=100000 "$PACE" launch kernel 16
ok=1
slow_polls() { grep -c '^P ' "$D/trace" || true; }
wait_for 20 waits_at "$D/trace" 8 1 || ok=0
p0=$(slow_polls)
polled_3() { [ "$(slow_polls)" -ge $((p0 + 3)) ]; }
wait_for 20 polled_3 || ok=0
echo 8 >"$D/run"
wait_for 20 grep -q "launched 16" "$D/out" || ok=0
released=$(grep -c "got RELEASE" "$D/sched.log" || true)
finish_paced "$D" || ok=0
if [ "$ok" = 1 ] && [ "$released" = 0 ] && [ "$(max_outstanding "$D/trace")" = 8 ] && grep -q "client done" "$D/out"; then
    pass "a thread waiting for its launch bound keeps the lock however long it does not run"
else
    fail "idle release during a pacing wait" "ok=$ok released=$released $(cat "$D/sched.log" "$D/out" "$D/err")"
fi
stop_fake

# 17c. Release on completion (SETTLE, protocol 7): with the scheduler's floor of 100 us and a window of
# 10 minutes, a production process that launched 8 kernels and then makes no GPU call keeps the lock
# while the held GPU has not run them (its background thread's event is polled and found not done: a W
# line), and releases once they ran, long before its window.
D=$TMP/settle
mkdir -p "$D"
start_fake "$D" settle=100
run_paced "$D" GPUSHARE_SOCKET="$D/s.sock" PACE_CLIENT_THEN="$D/then" "$PACE" launch kernel 8
ok=1
wait_for 20 grep -q "launched 8" "$D/out" || ok=0
wait_for 20 waits_at "$D/trace" 8 1 || ok=0
early=$(grep -c "got RELEASE" "$D/sched.log" || true)
echo 8 >"$D/run"
wait_for 20 grep -q "got RELEASE" "$D/sched.log" || ok=0
: >"$D/then"
wait_for 20 grep -q "launched 16" "$D/out" || ok=0
finish_paced "$D" || ok=0
if [ "$ok" = 1 ] && [ "$early" = 0 ] && grep -q "client done" "$D/out" &&
    grep -q "asks for a release once this process's GPU work completed and 100 us passed" "$D/err"; then
    pass "SETTLE: production releases once its work completed, not before, long before its idle window"
else
    fail "release on completion" "ok=$ok early=$early $(cat "$D/sched.log" "$D/out" "$D/err")"
fi
stop_fake

# 17d. The bound in GPU time (PACE_TIME 500 us beside PACE 3): launches whose kind is not timed yet keep
# to the count (3 outstanding, each a third of the bound); once timed (the stub's run 100 us each, in
# the first 64 launches, which the GPU runs), 5 are outstanding on the held GPU, and the 6th waits.
D=$TMP/pacetime
mkdir -p "$D"
start_fake "$D" pace=3 pace_time=500
run_paced "$D" GPUSHARE_SOCKET="$D/s.sock" PACE_CLIENT_THEN="$D/then" "$PACE" launch kernel 64
ok=1
wait_for 20 waits_at "$D/trace" 3 1 || ok=0
m3=$(max_outstanding "$D/trace")
echo 64 >"$D/run"
wait_for 20 grep -q "launched 64" "$D/out" || ok=0
p0=$(polls_waiting "$D/trace")
: >"$D/then"
waits_at_69() { [ "$(launches_made "$D/trace")" = 69 ] && [ "$(polls_waiting "$D/trace")" -gt "$p0" ]; }
wait_for 20 waits_at_69 || ok=0
made=$(launches_made "$D/trace")
finish_paced "$D" || ok=0
m=$(max_outstanding "$D/trace")
if [ "$ok" = 1 ] && [ "$m3" = 3 ] && [ "$m" = 5 ] && grep -q "client done" "$D/out" &&
    grep -q "at most 500 us of GPU time outstanding (the GPU scheduler's bound)" "$D/err"; then
    pass "PACE_TIME 500 us: 3 untimed launches, then 5 of 100 us outstanding"
else
    fail "PACE_TIME" "ok=$ok untimed max=$m3 max=$m made=$made $(cat "$D/sched.log" "$D/out" "$D/err")"
fi
stop_fake

# 18. GPUSHARE_PACE_OVERRIDE: 0 never paces, N paces at N whatever the scheduler says, a malformed value
# is ignored with one warning (the scheduler's bound holds).
D=$TMP/override
mkdir -p "$D"
start_fake "$D" pace=4
run_paced "$D" GPUSHARE_SOCKET="$D/s.sock" GPUSHARE_PACE_OVERRIDE=0 "$PACE" launch kernel 64
ok=1
wait_for 20 grep -q "launched 64" "$D/out" || ok=0
finish_paced "$D" || ok=0
if [ "$ok" = 1 ] && [ "$(max_outstanding "$D/trace")" = 64 ] && [ "$(grep -c '^R ' "$D/trace" || true)" = 0 ]; then
    pass "GPUSHARE_PACE_OVERRIDE=0 never paces, whatever the scheduler asks"
else
    fail "override 0" "ok=$ok $(cat "$D/out" "$D/err")"
fi
run_paced "$D" GPUSHARE_SOCKET="$D/s.sock" GPUSHARE_PACE_OVERRIDE=16 "$PACE" launch kernel 64
ok=1
wait_for 20 waits_at "$D/trace" 16 1 || ok=0
finish_paced "$D" || ok=0
if [ "$ok" = 1 ] && [ "$(max_outstanding "$D/trace")" = 16 ] && grep -q "GPUSHARE_PACE_OVERRIDE=16" "$D/err"; then
    pass "GPUSHARE_PACE_OVERRIDE=16 paces at 16 where the scheduler asks for 4"
else
    fail "override 16" "ok=$ok made=$(launches_made "$D/trace") $(cat "$D/out" "$D/err")"
fi
run_paced "$D" GPUSHARE_SOCKET="$D/s.sock" GPUSHARE_PACE_OVERRIDE=lots "$PACE" launch kernel 64
ok=1
wait_for 20 waits_at "$D/trace" 4 1 || ok=0
finish_paced "$D" || ok=0
n=$(grep -c "ignoring GPUSHARE_PACE_OVERRIDE=lots" "$D/err" || true)
if [ "$ok" = 1 ] && [ "$n" = 1 ] && [ "$(max_outstanding "$D/trace")" = 4 ]; then
    pass "a malformed GPUSHARE_PACE_OVERRIDE is ignored with one warning; the scheduler's bound holds"
else
    fail "malformed override" "ok=$ok n=$n $(cat "$D/out" "$D/err")"
fi
stop_fake

# 19. No pacing while a stream captures: after 16 paced launches that ran, during a global-mode capture
# 16 kernels on the capturing stream and 16 on another go through with the GPU held (a thread waiting
# would never get there), nothing is recorded into the capture or queried during it (the stub refuses
# that: "X"), the capture ends intact; after it the bound holds again. GPUSHARE_PACE_OVERRIDE=4, no
# scheduler.
D=$TMP/pacecap
mkdir -p "$D"
run_paced "$D" GPUSHARE_PACE_OVERRIDE=4 "$PACE" capture 16
echo 16 >"$D/run"
ok=1
wait_for 20 grep -q "capture launched 32" "$D/out" || ok=0
wait_for 20 grep -q "capture_end=0" "$D/out" || ok=0
wait_for 20 test "$(polls_waiting "$D/trace")" -ge 1 || ok=0
finish_paced "$D" || ok=0
x=$(grep -c '^X ' "$D/trace" || true)
if [ "$ok" = 1 ] && [ "$x" = 0 ] && grep -q "client done" "$D/out"; then
    pass "no pacing during a stream capture; the bound holds again after it"
else
    fail "pacing during capture" "ok=$ok x=$x $(grep '^X ' "$D/trace" | head -3) $(cat "$D/out" "$D/err")"
fi

# 20. A destroyed context's events are never used: after cuCtxDestroy, and after the primary context's
# release, the next launches get new events (records in both halves) and the stub, which fails any use
# of a dead event with an "X", sees none.
for mode in ctxgone primary; do
    D=$TMP/pace$mode
    mkdir -p "$D"
    out=$(run_client GPUSHARE_PACE_OVERRIDE=4 GPUSHARE_STUB_TRACE="$D/trace" timeout 20 "$PACE" $mode 16 2>&1 || true)
    x=$(grep -c '^X ' "$D/trace" || true)
    r=$(grep -c '^R ' "$D/trace" || true)
    # the records made after the 16th launch: the second context's
    late=$(awk '$1 == "Q" && $4 ~ /^cuLaunch/ {q++} $1 == "R" && q > 16 {r++} END {print r + 0}' "$D/trace")
    if grep -q "client done" <<<"$out" && [ "$x" = 0 ] && [ "$late" -ge 1 ] && ! grep -q "pacing off" <<<"$out"; then
        pass "pacing forgets a context's events when it goes ($mode) and paces the next one"
    else
        fail "pacing across $mode" "x=$x r=$r late=$late $(grep '^X ' "$D/trace" | head -2) $out"
    fi
done

# 21. An event call that fails turns pacing off (for a back-off) with one warning; no launch fails (the GPU held: all
# 64 are made while none ran).
for call in create record query; do
    D=$TMP/pacefail$call
    mkdir -p "$D"
    run_paced "$D" GPUSHARE_PACE_OVERRIDE=4 GPUSHARE_STUB_EVENT_FAIL=$call "$PACE" launch kernel 64
    ok=1
    wait_for 20 grep -q "launched 64" "$D/out" || ok=0
    finish_paced "$D" || ok=0
    n=$(grep -c "launch pacing off for this process for 1.0 s: cuEvent" "$D/err" || true)
    if [ "$ok" = 1 ] && [ "$n" = 1 ] && grep -q "client done" "$D/out"; then
        pass "a failing cuEvent $call turns pacing off with one warning; every launch succeeds"
    else
        fail "event $call failure" "ok=$ok n=$n $(cat "$D/out" "$D/err")"
    fi
done

# 22. The wait is bounded: work of its own that never completes (the GPU held throughout) holds a launch
# GPUSHARE_PACE_WAIT_MAX_MS at most, then pacing is off for the process and the launches go on. The
# trace says where the thread stopped: the fifth launch was made at least 300 ms after the fourth (the
# bound held it), and not 20 s later (it was let go). The state "stopped at 4" lasts 300 ms only, too
# short for a test to catch by looking while it lasts on a loaded machine.
D=$TMP/pacestall
mkdir -p "$D"
run_paced "$D" GPUSHARE_PACE_OVERRIDE=4 GPUSHARE_PACE_WAIT_MAX_MS=300 "$PACE" launch kernel 16
ok=1
wait_for 20 grep -q "launched 16" "$D/out" || ok=0
ms=$((($(launch_ns "$D/trace" 5) - $(launch_ns "$D/trace" 4)) / 1000000))
finish_paced "$D" || ok=0
if [ "$ok" = 1 ] && [ "$ms" -ge 300 ] && [ "$ms" -lt 20000 ] &&
    grep -q "did not finish within GPUSHARE_PACE_WAIT_MAX_MS=300 ms" "$D/err" && grep -q "client done" "$D/out"; then
    pass "a launch waits GPUSHARE_PACE_WAIT_MAX_MS at most for work that does not complete, then pacing is off (${ms} ms)"
else
    fail "stalled pacing" "ok=$ok ms=$ms $(cat "$D/out" "$D/err")"
fi

# 23. Four threads launching at once on streams of their own: every launch succeeds and the queue stays
# within the bound plus one launch per other thread (8 + 3).
D=$TMP/pacethreads
mkdir -p "$D"
out=$(run_client GPUSHARE_PACE_OVERRIDE=8 GPUSHARE_STUB_LAUNCH_US=100 GPUSHARE_STUB_TRACE="$D/trace" timeout 60 "$PACE" threads 4 500 2>&1 || true)
m=$(max_outstanding "$D/trace")
if grep -q "launched 2000" <<<"$out" && grep -q "client done" <<<"$out" && [ "$m" -le 11 ] && [ "$m" -ge 8 ]; then
    pass "four threads launching at once stay within the bound plus one launch each (max $m)"
else
    fail "pacing under threads" "max=$m $out"
fi

# 24. A scheduler of protocol 3 closes the connection at a version 6, 5 and 4 HELLO: the
# shim steps down to version 3 and runs under its lock as before (every frame in version 3, or the
# scheduler drops it), without pacing (all 64 launches made while none ran).
D=$TMP/v3
mkdir -p "$D"
start_fake "$D" version=3 pace=4
run_paced "$D" GPUSHARE_SOCKET="$D/s.sock" "$PACE" launch kernel 64
ok=1
wait_for 20 grep -q "launched 64" "$D/out" || ok=0
finish_paced "$D" || ok=0
hellos=$(grep -e "HELLO" "$D/sched.log" | tr '\n' ' ')
if [ "$ok" = 1 ] && grep -q "client done" "$D/out" && [ "$hellos" = "$(want_hellos 3)" ] && grep -q "got ACQUIRE" "$D/sched.log" &&
    ! grep -q "changed protocol version" "$D/sched.log" && ! grep -q "sent PACE" "$D/sched.log" &&
    grep -q "speaks protocol 3 .*: no launch pacing, no scheduler idle window and no claim ledger" "$D/err" &&
    ! grep -q "GPU lock disabled" "$D/err"; then
    pass "a protocol 3 scheduler: the shim falls back to version 3 and takes its lock, unpaced"
else
    fail "protocol 3 scheduler" "ok=$ok hellos=$hellos $(cat "$D/sched.log" "$D/out" "$D/err")"
fi
stop_fake

# too_new NAME PASS_MESSAGE SENT FAKE_ARGS -- COMMAND...: the fake sends a client a message its protocol
# version does not have (FAKE_ARGS make it send it anyway; SENT is its log line of the sending); the
# client's shim takes it as a protocol error: pass-through with one warning, COMMAND completes.
too_new() {
    local d=$TMP/$1 msg=$2 sent=$3 args=()
    shift 3
    while [ "$1" != -- ]; do args+=("$1"); shift; done
    shift
    mkdir -p "$d"
    start_fake "$d" "${args[@]}"
    local out n
    out=$(run_client GPUSHARE_SOCKET="$d/s.sock" timeout 20 "$@" 2>&1 || true)
    n=$(grep -c "GPU lock disabled" <<<"$out" || true)
    if grep -q "client done" <<<"$out" && [ "$n" = 1 ] && grep -q "protocol error from the GPU scheduler" <<<"$out" &&
        grep -q "$sent" "$d/sched.log"; then
        pass "$msg"
    else
        fail "$msg" "$(cat "$d/sched.log") $out"
    fi
    stop_fake
}

# A PACE in a version 3 connection (it came with version 4) is a protocol error: pass-through, one warning.
too_new v3pace "PACE sent to a protocol 3 client is a protocol error: pass-through with one warning" \
    "sent PACE max_queued=4" version=3 pace=4 pace_any=1 -- "$PACE" launch kernel 16

# 24b. One event per run of launches: 512 kernels of 10 us under a bound of 64 record an event each only
# until their kind is timed (its first four, then every 64th launch), and otherwise one per run (16
# launches at most, or a quarter of the bound's weight): at most a quarter as many records as launches.
D=$TMP/pacerun
mkdir -p "$D"
out=$(run_client GPUSHARE_PACE_OVERRIDE=64 GPUSHARE_LOG_LEVEL=info GPUSHARE_STUB_TRACE="$D/trace" timeout 20 "$PACE" launch kernel 512 2>&1 || true)
r=$(grep -c '^R ' "$D/trace" || true)
if grep -q "client done" <<<"$out" && [ "$r" -ge 1 ] && [ "$r" -le 128 ] && ! grep -q "pacing off" <<<"$out" &&
    grep -q "launch pacing: 512 launches paced" <<<"$out"; then
    pass "pacing records one event per run of launches ($r for 512)"
else
    fail "one event per run" "r=$r $out"
fi

# 25. The bound is the connection's: when the scheduler goes away the waiting thread goes on unbounded;
# the scheduler that comes back (REJOIN) sends its own bound, which holds from then on.
D=$TMP/pacerejoin
mkdir -p "$D"
start_fake "$D" pace=4
run_paced "$D" GPUSHARE_SOCKET="$D/s.sock" GPUSHARE_RECONNECT_MAX_MS=50 PACE_CLIENT_THEN="$D/then" "$PACE" launch kernel 32
ok=1
wait_for 20 waits_at "$D/trace" 4 1 || ok=0
stop_fake
rm -f "$D/s.sock"
wait_for 20 grep -q "launched 32" "$D/out" || ok=0
m1=$(max_outstanding "$D/trace")
echo 32 >"$D/run" # the 32 run (a reconnection drains the GPU first); nothing more until the test says so
start_fake "$D" pace=6
wait_for 20 grep -q "got REJOIN" "$D/sched.log" || ok=0
wait_for 20 grep -q "at most 6 launches outstanding" "$D/err" || ok=0
: >"$D/then"
wait_for 20 waits_at "$D/trace" $((32 + 6)) 2 || ok=0
finish_paced "$D" || ok=0
if [ "$ok" = 1 ] && [ "$m1" = 32 ] && grep -q "client done" "$D/out"; then
    pass "a lost scheduler's bound ends with its connection; the new scheduler's holds after REJOIN"
else
    fail "pacing across a reconnection" "ok=$ok m1=$m1 made=$(launches_made "$D/trace") $(cat "$D/out" "$D/err" "$D/sched.log")"
fi
stop_fake

# 25b. A scheduler that did not answer the first connect (the agent restarting, a late WELCOME, a pod at
# its connection limit) is connected later, as after a lost connection: the process runs its first launches
# without the lock, connects once the scheduler is there (REJOIN with nothing held), and its next launches
# wait for the lock (this scheduler never grants) instead of running past it.
D=$TMP/lateconnect
mkdir -p "$D"
run_paced "$D" GPUSHARE_SOCKET="$D/s.sock" GPUSHARE_RECONNECT_MAX_MS=50 PACE_CLIENT_THEN="$D/then" "$PACE" launch kernel 8
ok=1
wait_for 20 grep -q "launched 8" "$D/out" || ok=0
echo 8 >"$D/run" # the first 8 run (connecting drains the GPU first)
start_fake "$D" grant=0
wait_for 20 grep -q "connected to the GPU scheduler after" "$D/err" || ok=0
: >"$D/then"
wait_for 20 grep -q "got ACQUIRE" "$D/sched.log" || ok=0
made=$(launches_made "$D/trace")
stop_fake # the lock's holder goes away: the process runs without it, reconnecting, and finishes
finish_paced "$D" || ok=0
if [ "$ok" = 1 ] && [ "$made" = 8 ] && grep -q "got REJOIN" "$D/sched.log" && grep -q "launched 16" "$D/out" &&
    ! grep -q "GPU lock disabled" "$D/err"; then
    pass "a scheduler absent at the first connect is connected later and its lock holds from then on"
else
    fail "connect after a failed first connect" "ok=$ok made=$made $(cat "$D/out" "$D/err" "$D/sched.log")"
fi

# 25c. The connection's timings are the scheduler's to loosen, not the pod's: a pod that sets a connect
# timeout shorter than a busy scheduler's WELCOME still connects at its first context (the default holds
# until a scheduler allows otherwise), and a scheduler that does not allow it (POLICY 0) names the values
# it ignores, a longer reconnection back-off among them.
D=$TMP/conntimings
mkdir -p "$D"
start_fake "$D" welcome_delay_ms=300 policy=0
out=$(run_client GPUSHARE_SOCKET="$D/s.sock" GPUSHARE_LOG_LEVEL=info GPUSHARE_CONNECT_TIMEOUT_MS=50 \
    GPUSHARE_RECONNECT_MAX_MS=600000 timeout 20 "$CLIENT" dlsym 5 2>&1)
if grep -q "client done" <<<"$out" && grep -q "connected to $D/s.sock" <<<"$out" && ! grep -q "cannot reach" <<<"$out" &&
    grep -q "ignoring.*GPUSHARE_CONNECT_TIMEOUT_MS=50 GPUSHARE_RECONNECT_MAX_MS=600000" <<<"$out"; then
    pass "a pod's shorter connect timeout and longer reconnection back-off are not taken"
else
    fail "connection timings from the pod" "$out $(cat "$D/sched.log")"
fi
stop_fake

# 26. A child forked by a paced process has none of its parent's events (CUDA does not survive fork): it
# paces its own launches with events of its own, and never waits for the parent's.
out=$(run_client GPUSHARE_PACE_OVERRIDE=4 GPUSHARE_PACE_WAIT_MAX_MS=60000 CLIENT_FORK_AT=20 CLIENT_FORK_LAUNCHES=50 \
    timeout 20 "$CLIENT" dlsym 40 2>&1 || true)
if grep -q "child done" <<<"$out" && grep -q "child status=0" <<<"$out" && grep -q "client done" <<<"$out" &&
    ! grep -q "pacing off" <<<"$out"; then
    pass "a forked child paces with events of its own"
else
    fail "pacing after fork" "$out"
fi

# --- The scheduler's idle window (IDLE, protocol 5) ---
# The client lingers, alive and idle, after its last GPU call: only an idle release frees the lock then
# (a process that exits ends its connection without a RELEASE), so "got RELEASE" in the fake's log while
# the client still runs says the window in force ran out. The bound of the wait (seconds) is far below
# the longer of the two windows; it is no measure of speed.
released_idle() { # DIR PID: the fake got a RELEASE while PID (the lingering client) still ran
    wait_for 3 grep -q "got RELEASE" "$1/sched.log" && kill -0 "$2" 2>/dev/null
}
run_lingering() { # DIR [VAR=VALUE...]: the client, 5 launches then 4 s idle, in the background; DIR/out, DIR/err
    local d=$1
    shift
    run_client GPUSHARE_SOCKET="$d/s.sock" GPUSHARE_LOG_LEVEL=info "$@" \
        timeout 30 "$CLIENT" dlsym 5 0 0 4000 >"$d/out" 2>"$d/err" &
    LC=$!
}

# idle_case NAME FAKE_IDLE_US CLIENT_ENV LOG PASS_MESSAGE: the fake scheduler sends IDLE FAKE_IDLE_US to a
# lingering client with CLIENT_ENV; it must release within seconds of its last call and log LOG.
idle_case() {
    local d=$TMP/$1
    mkdir -p "$d"
    start_fake "$d" idle="$2"
    run_lingering "$d" "$3"
    local ok=1
    released_idle "$d" "$LC" || ok=0
    wait "$LC" || ok=0
    if [ "$ok" = 1 ] && grep -q "sent IDLE idle_us=$2\$" "$d/sched.log" && grep -q "client done" "$d/out" &&
        grep -q "$4" "$d/err"; then
        pass "$5"
    else
        fail "$5" "ok=$ok $(cat "$d/sched.log" "$d/out" "$d/err")"
    fi
    stop_fake
}

# 27. The scheduler's window shorter than the client's own: IDLE 20000 us to a client whose
# GPUSHARE_IDLE_MS=600000 (ten minutes) releases within seconds of its last call. The client's own
# window shorter than the scheduler's wins: GPUSHARE_IDLE_US=20000 against IDLE of ten minutes still
# releases within seconds (the environment may shorten the window, never lengthen it).
idle_case idle 20000 GPUSHARE_IDLE_MS=600000 "the GPU scheduler asks for an idle release after 20000 us\$" \
    "IDLE 20000 us: a client whose own window is 10 minutes releases the lock while it lingers"
idle_case idleown 600000000 GPUSHARE_IDLE_US=20000 "after 600000000 us; this process's shorter window of 20000 us holds" \
    "IDLE of 10 minutes: a client whose own window is 20 ms keeps its own and releases while it lingers"

# 28. A scheduler of protocol 4 closes the connection at a version 6 and a version 5 HELLO: the shim greets it again in
# version 4, is paced by it (PACE) and takes its lock, and says the connection has no scheduler idle
# window; the fake sends no IDLE to a version 4 client.
D=$TMP/v4
mkdir -p "$D"
start_fake "$D" version=4 pace=4 idle=20000
out=$(run_client GPUSHARE_SOCKET="$D/s.sock" GPUSHARE_LOG_LEVEL=info timeout 20 "$CLIENT" dlsym 5 2>&1 || true)
hellos=$(grep -e "HELLO" "$D/sched.log" | tr '\n' ' ')
if grep -q "client done" <<<"$out" && [ "$hellos" = "$(want_hellos 4)" ] &&
    grep -q "sent PACE max_queued=4" "$D/sched.log" && grep -q "got ACQUIRE" "$D/sched.log" &&
    ! grep -q "sent IDLE" "$D/sched.log" && ! grep -q "changed protocol version" "$D/sched.log" &&
    grep -q "at most 4 launches outstanding (the GPU scheduler's bound)" <<<"$out" &&
    grep -q "speaks protocol 4 .*: no scheduler idle window and no claim ledger, and a wait counts from its start\$" <<<"$out" && ! grep -q "GPU lock disabled" <<<"$out"; then
    pass "a protocol 4 scheduler: the shim falls back to version 4, paced and under its lock, without its idle window"
else
    fail "protocol 4 scheduler" "hellos=$hellos $(cat "$D/sched.log") $out"
fi
stop_fake

# An IDLE in a version 4 connection (it came with version 5) is a protocol error: pass-through, one warning.
too_new v4idle "IDLE sent to a protocol 4 client is a protocol error: pass-through with one warning" \
    "sent IDLE idle_us=20000" version=4 idle=20000 idle_any=1 -- "$CLIENT" dlsym 5

# 29. Launches count by how long they run: under PACE 8, 20 us launches not timed yet count as whole
# launches (the thread stops at 8 outstanding). The first to run is not timed (nothing ran before it):
# the thread makes one launch more, weighed whole, and stops at 9. Once those 9 ran, the second timed
# their kind (20 us, the stub's time) before any later launch was weighed: each counts as 4/16 of one
# (GPUSHARE_PACE_FULL_US=100) and the thread stops at 32 outstanding, 41 made. With
# GPUSHARE_PACE_FULL_US=0, or a driver that refuses to time events (pacing stays on), it stops at 8 again.
# The GPU runs one launch, then all made so far: the thread's state each time does not depend on which
# of the launches it found complete at each look (a first look after 3 of 8 ran weighs the next launch
# whole, a look after all 8 weighs it 4/16).
weigh_case() { # NAME WANT_MAX WANT_TIMED [VAR=VALUE...]
    local name=$1 want=$2 timed=$3
    shift 3
    D=$TMP/weigh-$name
    mkdir -p "$D"
    start_fake "$D" pace=8
    run_paced "$D" GPUSHARE_SOCKET="$D/s.sock" GPUSHARE_STUB_LAUNCH_US=20 "$@" "$PACE" launch kernel 64
    ok=1
    wait_for 20 waits_at "$D/trace" 8 1 || ok=0
    echo 1 >"$D/run"
    wait_for 20 waits_at "$D/trace" 9 2 || ok=0
    echo 9 >"$D/run"
    wait_for 20 waits_at "$D/trace" $((9 + want)) 3 || ok=0
    finish_paced "$D" || ok=0
    m=$(max_outstanding "$D/trace")
    if [ "$ok" = 1 ] && [ "$m" = "$want" ] && grep -q "client done" "$D/out" &&
        grep -q "launch pacing: 64 launches paced, .* $timed kinds of launch timed" "$D/err" &&
        ! grep -q "launch pacing off" "$D/err"; then
        pass "PACE 8, 20 us launches ($name): at most $want outstanding once the first 9 ran"
    else
        fail "weighed pacing ($name)" "ok=$ok max=$m made=$(launches_made "$D/trace") $(cat "$D/out" "$D/err")"
    fi
    stop_fake
}
weigh_case weighed 32 1
weigh_case "GPUSHARE_PACE_FULL_US=0" 8 1 GPUSHARE_PACE_FULL_US=0
weigh_case "timing refused" 8 0 GPUSHARE_STUB_EVENT_FAIL=elapsed

# --- The claim's ledger (protocol 6) ---
# 30. In a claim of 1 GiB with a context reserve of 256 MiB per process, cuMemGetInfo reports 768 MiB (the
# claim less the process's context), a process that allocates exactly what it offers gets all of it and
# the next MiB is refused; grants went out in chunks, never beyond the claim less the context; frees give
# the slack back (RETURN) down to at most two chunks. With a second process of the claim holding 256 MiB
# (others, procs=2) the total is 512 MiB and 256 MiB are free.
LEDGER="$BUILD/tests/ledger_client"
ledger_case() { # NAME EXPECT_TOTAL EXPECT_FREE fake-args...
    local name=$1 total=$2 free=$3
    shift 3
    D=$TMP/ledger-$name
    mkdir -p "$D"
    start_fake "$D" "$@"
    out=$(run_client GPUSHARE_SOCKET="$D/s.sock" GPUSHARE_MEMORY_LIMIT_BYTES=1073741824 timeout 20 "$LEDGER" fill 2>&1 || true)
    stop_fake
    maxgrant=$(grep -o "grant=[0-9]*" "$D/sched.log" | cut -d= -f2 | sort -n | tail -1)
    last=$(grep -o "grant=[0-9]*" "$D/sched.log" | tail -1 | cut -d= -f2)
    if grep -q "ledger fill total=$total free=$free got=$free over=2 free_after=0" <<<"$out" && grep -q "client done" <<<"$out" &&
        [ "${maxgrant:-0}" -le "$free" ] && grep -q "sent CHARGED added=67108864" "$D/sched.log" &&
        grep -q "got RETURN flags=0" "$D/sched.log" && [ "${last:-0}" -le $((2 * 67108864)) ]; then
        pass "claim ledger ($name): cuMemGetInfo offers $free of a total of $total, all of it is granted in chunks, no byte more; slack goes back"
    else
        fail "claim ledger ($name)" "maxgrant=$maxgrant last=$last $out $(cat "$D/sched.log")"
    fi
}
ledger_case alone 805306368 805306368 claim=1073741824
ledger_case shared 536870912 268435456 claim=1073741824 others=268435456 procs=2

# 31. A scheduler that never answers a CHARGE costs the allocation GPUSHARE_MEMREPLY_TIMEOUT_MS, then out of
# memory (2); the process is neither hung nor killed.
D=$TMP/ledger-stall
mkdir -p "$D"
start_fake "$D" claim=1073741824 stall_charge=1
out=$(run_client GPUSHARE_SOCKET="$D/s.sock" GPUSHARE_MEMORY_LIMIT_BYTES=1073741824 GPUSHARE_MEMREPLY_TIMEOUT_MS=300 \
    timeout 20 "$LEDGER" one 2>&1 || true)
stop_fake
ms=$(grep -o "ledger one r=2 ms=[0-9]*" <<<"$out" | cut -d= -f3)
if [ -n "$ms" ] && [ "$ms" -ge 250 ] && [ "$ms" -lt 3000 ] && grep -q "client done" <<<"$out" &&
    grep -q "did not answer a request" <<<"$out"; then
    pass "claim ledger: no answer to a CHARGE fails the allocation after GPUSHARE_MEMREPLY_TIMEOUT_MS (${ms} ms)"
else
    fail "claim ledger with a scheduler that does not answer" "$out $(cat "$D/sched.log")"
fi

# 32b. The process connects when it creates its first context, before the context exists: a claim whose
# ledger has no room for one more context (LEDGER REFUSED) fails that creation with out of memory, the
# application sees the error and ends normally, and no CHARGE is ever sent.
D=$TMP/ledger-refused
mkdir -p "$D"
start_fake "$D" claim=1073741824 procs=1 others=805306368 refused=1
out=$(run_client GPUSHARE_SOCKET="$D/s.sock" GPUSHARE_MEMORY_LIMIT_BYTES=1073741824 timeout 20 "$LEDGER" fill 2>&1)
rc=$?
stop_fake
if [ $rc -eq 0 ] && grep -q "ledger ctx r=2\$" <<<"$out" && grep -q "client done" <<<"$out" &&
    grep -q "may not create a CUDA context: its claim of 1073741824 bytes on this GPU has no room for one more" <<<"$out" &&
    ! grep -q "ledger fill" <<<"$out" && ! grep -q "CHARGE\|RETURN" "$D/sched.log" &&
    [ "$(grep -c "sent LEDGER" "$D/sched.log")" = 1 ]; then
    pass "claim ledger: a context the claim has no room for is refused before it exists (out of memory, process unharmed)"
else
    fail "claim ledger refusing a context" "rc=$rc $out $(cat "$D/sched.log")"
fi

# 32. A protocol 5 scheduler (no ledger): the shim steps down and keeps its per-process limit, reported whole.
D=$TMP/ledger-v5
mkdir -p "$D"
start_fake "$D" version=5 claim=1073741824
out=$(run_client GPUSHARE_SOCKET="$D/s.sock" GPUSHARE_MEMORY_LIMIT_BYTES=1073741824 GPUSHARE_LOG_LEVEL=info timeout 20 "$LEDGER" fill 2>&1 || true)
stop_fake
if grep -q "ledger fill total=1073741824 free=1073741824 got=1073741824 over=2" <<<"$out" &&
    grep -q "speaks protocol 5 .*: no claim ledger (the per-process memory limit alone)" <<<"$out" && ! grep -q "CHARGE" "$D/sched.log"; then
    pass "a protocol 5 scheduler: the shim steps down and keeps its per-process limit"
else
    fail "claim ledger against a protocol 5 scheduler" "$out $(cat "$D/sched.log")"
fi

# 32b. A scheduler that is shutting down (an agent restart or rollout) closes the connections it accepts
# meanwhile at their HELLO, as an older scheduler refuses a version: the shim greets the same version
# again before it steps down, so its successor (here: the same fake, from the third connection on) is
# spoken to in the shim's own protocol, claim ledger and all. Once taken for an older scheduler, the
# process would have allocated its whole per-process limit without asking for the rest of the connection
# (soak seed 30169).
D=$TMP/ledger-restart
mkdir -p "$D"
start_fake "$D" drop_hellos=2 claim=1073741824
out=$(run_client GPUSHARE_SOCKET="$D/s.sock" GPUSHARE_MEMORY_LIMIT_BYTES=1073741824 GPUSHARE_LOG_LEVEL=info timeout 20 "$LEDGER" fill 2>&1 || true)
stop_fake
if [ "$(grep -c "dropped HELLO version=$PROTO" "$D/sched.log")" = 2 ] && ! grep -q "speaks protocol" <<<"$out" &&
    grep -q "ledger fill total=805306368 free=805306368 got=805306368 over=2" <<<"$out" && grep -q "got CHARGE" "$D/sched.log"; then
    pass "a scheduler that closes two HELLOs while it shuts down: the shim keeps its protocol and its claim ledger"
else
    fail "HELLOs closed by a scheduler shutting down" "$out $(cat "$D/sched.log")"
fi

# --- Waiting behind a scheduler that answers (protocol 6) ---
# 33. Long load: the scheduler never grants (production keeps the GPU without a gap) but answers; a waiter
# with GPUSHARE_WAIT_TIMEOUT_MS=300 asks (PING) when it heard nothing for a quarter of that and never
# passes through: 12 answered PINGs span three timeouts and more, and not one of its launches ran. Once the
# scheduler stops answering (SIGSTOP: alive, but not serving), the waiter passes through within the
# timeout of its last answer (at least 300 ms less the 75 ms between PINGs) with one warning and completes; killed, the scheduler's connection ends and a waiter runs without
# the lock at once (checked against the real scheduler: TestWaiterBehindGaplessProduction...).
D=$TMP/longload
mkdir -p "$D"
start_fake "$D" grant=0
run_client GPUSHARE_SOCKET="$D/s.sock" GPUSHARE_WAIT_TIMEOUT_MS=300 GPUSHARE_STUB_TRACE="$D/trace" \
    timeout 30 "$CLIENT" dlsym 5 >"$D/out" 2>"$D/err" &
CPID=$!
ok=1
pongs() { grep -c "sent PONG" "$D/sched.log" || true; }
answered() { [ "$(pongs)" -ge 12 ]; }
wait_for 20 answered || ok=0
passed_early=0
if grep -q "GPU lock disabled" "$D/err" || grep -q "client done" "$D/out" || grep -q "cuLaunch" "$D/trace" 2>/dev/null; then
    passed_early=1
fi
kill -STOP "$FAKE"
t0=$(date +%s%N)
wait_for 20 grep -q "client done" "$D/out" || ok=0
ms=$((($(date +%s%N) - t0) / 1000000))
kill -CONT "$FAKE"
wait "$CPID" || ok=0
n=$(grep -c "GPU lock disabled" "$D/err" || true)
if [ "$ok" = 1 ] && [ "$passed_early" = 0 ] && [ "$n" = 1 ] &&
    grep -q "no word from the GPU scheduler within GPUSHARE_WAIT_TIMEOUT_MS" "$D/err" && [ "$ms" -ge 200 ]; then
    pass "a waiter behind a scheduler that answers never passes through ($(pongs) answers); it does ${ms} ms after the scheduler stops answering"
else
    fail "waiting behind a live scheduler" "ok=$ok early=$passed_early n=$n ms=$ms $(cat "$D/out" "$D/err")"
fi
stop_fake

# 34. A scheduler that never answers a PING: the waiter passes through after GPUSHARE_WAIT_TIMEOUT_MS.
D=$TMP/nopong
mkdir -p "$D"
start_fake "$D" grant=0 pong=0
out=$(run_client GPUSHARE_SOCKET="$D/s.sock" GPUSHARE_WAIT_TIMEOUT_MS=300 timeout 20 "$CLIENT" dlsym 5 2>&1 || true)
if grep -q "client done" <<<"$out" && grep -q "got PING" "$D/sched.log" &&
    grep -q "no word from the GPU scheduler within GPUSHARE_WAIT_TIMEOUT_MS" <<<"$out"; then
    pass "a scheduler that does not answer its waiter's PING: pass-through after the wait timeout"
else
    fail "unanswered PING" "$(cat "$D/sched.log") $out"
fi
stop_fake

# 35. A scheduler of protocol 5 (no PING): the wait counts from its start, as it did; no PING is sent.
D=$TMP/v5wait
mkdir -p "$D"
start_fake "$D" version=5 grant=0
out=$(run_client GPUSHARE_SOCKET="$D/s.sock" GPUSHARE_WAIT_TIMEOUT_MS=300 GPUSHARE_LOG_LEVEL=info timeout 20 "$CLIENT" dlsym 5 2>&1 || true)
if grep -q "client done" <<<"$out" && ! grep -q "got PING" "$D/sched.log" && ! grep -q "changed protocol version" "$D/sched.log" &&
    grep -q "no grant within GPUSHARE_WAIT_TIMEOUT_MS" <<<"$out" && grep -q "speaks protocol 5" <<<"$out"; then
    pass "a protocol 5 scheduler: the shim steps down, sends no PING, and its wait counts from the start"
else
    fail "protocol 5 wait" "$(cat "$D/sched.log") $out"
fi
stop_fake

# --- Pacing that holds (protocol 6) ---
# 36. A stall turns the bound off for a back-off, not for good: under PACE 4 with work that never runs,
# the launch waits GPUSHARE_PACE_WAIT_MAX_MS (300 ms), pacing goes off for 1 s (PACING reports the
# back-off), the 16 launches go on; after the back-off the bound holds again (the next 16 stop at 4
# outstanding once the first ran) and PACING says so. As in 22, the trace says the thread stopped at 4;
# the back-off began before the fifth launch was made, so it is over once the clock of the trace
# (CLOCK_MONOTONIC) passed that launch by 1 s: the test waits for that, then lets the client go on.
cat >"$TMP/mono_ns.c" <<'C'
#include <stdio.h>
#include <time.h>
int main(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    printf("%lld\n", (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
    return 0;
}
C
${CC:-gcc} -o "$TMP/mono_ns" "$TMP/mono_ns.c"
clock_past() { [ "$("$TMP/mono_ns")" -ge "$1" ]; } # NS: the monotonic clock reached NS
D=$TMP/rearm
mkdir -p "$D"
start_fake "$D" pace=4
run_paced "$D" GPUSHARE_SOCKET="$D/s.sock" GPUSHARE_PACE_WAIT_MAX_MS=300 PACE_CLIENT_THEN="$D/then" "$PACE" launch kernel 16
ok=1
wait_for 20 grep -q "launched 16" "$D/out" || ok=0
wait_for 20 grep -q "got PACING max_queued=0 state=2" "$D/sched.log" || ok=0
stalled_ms=$((($(launch_ns "$D/trace" 5) - $(launch_ns "$D/trace" 4)) / 1000000))
echo 16 >"$D/run"
wait_for 20 clock_past $(($(launch_ns "$D/trace" 5) + 1000000000)) || ok=0
w0=$(polls_waiting "$D/trace")
: >"$D/then"
rearmed() { [ "$(launches_made "$D/trace")" = 20 ] && [ "$(polls_waiting "$D/trace")" -gt "$w0" ]; }
wait_for 20 rearmed || ok=0
finish_paced "$D" || ok=0
reports=$(grep "got PACING" "$D/sched.log" | tr '\n' ' ')
if [ "$ok" = 1 ] && [ "$stalled_ms" -ge 300 ] && grep -q "launch pacing off for this process for 1.0 s" "$D/err" &&
    [ "$reports" = "got PACING max_queued=4 state=0 got PACING max_queued=0 state=2 got PACING max_queued=4 state=0 " ]; then
    pass "a stall turns pacing off for a back-off; then the bound holds again, and the scheduler hears each state"
else
    fail "pacing re-armed" "ok=$ok stalled_ms=$stalled_ms made=$(launches_made "$D/trace") reports=$reports $(cat "$D/out" "$D/err")"
fi
stop_fake

# 37. Where the scheduler does not allow it (no POLICY, as the agent's), GPUSHARE_PACE_OVERRIDE=0 is ignored
# with one warning and the scheduler's bound holds (the thread stops at 4), and PACING says so; a stricter
# setting (GPUSHARE_PACE_WAIT_MAX_MS above the default) is taken without a word.
D=$TMP/policy
mkdir -p "$D"
start_fake "$D" pace=4 policy=-1
run_paced "$D" GPUSHARE_SOCKET="$D/s.sock" GPUSHARE_PACE_OVERRIDE=0 "$PACE" launch kernel 16
ok=1
wait_for 20 waits_at "$D/trace" 4 1 || ok=0
finish_paced "$D" || ok=0
n=$(grep -c "does not let this pod's environment loosen the GPU lock; ignoring GPUSHARE_PACE_OVERRIDE=0 (" "$D/err" || true)
if [ "$ok" = 1 ] && [ "$n" = 1 ] && [ "$(max_outstanding "$D/trace")" = 4 ] &&
    grep -q "got PACING max_queued=4 state=0" "$D/sched.log" && ! grep -q "state=1" "$D/sched.log" &&
    ! grep -q "PACE_WAIT_MAX_MS" "$D/err"; then
    pass "no POLICY: GPUSHARE_PACE_OVERRIDE=0 is ignored with one warning, the scheduler's bound holds"
else
    fail "override not allowed" "ok=$ok n=$n max=$(max_outstanding "$D/trace") $(cat "$D/sched.log" "$D/err")"
fi
stop_fake
start_fake "$D" pace=4 policy=0
out=$(run_client GPUSHARE_SOCKET="$D/s.sock" GPUSHARE_WAIT_TIMEOUT_MS=5 GPUSHARE_PACE_FULL_US=100000 GPUSHARE_MEMREPLY_TIMEOUT_MS=1 \
    timeout 20 "$CLIENT" dlsym 5 2>&1 || true)
if grep -q "client done" <<<"$out" &&
    grep -q "ignoring GPUSHARE_PACE_FULL_US=100000 GPUSHARE_WAIT_TIMEOUT_MS=5 GPUSHARE_MEMREPLY_TIMEOUT_MS=1 (" <<<"$out"; then
    pass "POLICY 0: a shorter wait timeout or MEMREPLY timeout and a looser weighing are ignored"
else
    fail "loosening settings not allowed" "$out"
fi
stop_fake
# ... and where it allows them (POLICY 1, the standalone scheduler) the override holds and is reported.
start_fake "$D" pace=4 policy=1
run_paced "$D" GPUSHARE_SOCKET="$D/s.sock" GPUSHARE_PACE_OVERRIDE=0 "$PACE" launch kernel 16
ok=1
wait_for 20 grep -q "launched 16" "$D/out" || ok=0
finish_paced "$D" || ok=0
if [ "$ok" = 1 ] && grep -q "got PACING max_queued=0 state=1" "$D/sched.log" && ! grep -q "loosen the GPU lock" "$D/err"; then
    pass "POLICY 1: GPUSHARE_PACE_OVERRIDE=0 holds and the scheduler hears it (state Override)"
else
    fail "override allowed" "ok=$ok $(cat "$D/sched.log" "$D/err")"
fi
stop_fake

# 38. Several GPUs in one process (the list form, docs/multigpu.md): the stub has two devices.
MULTI="$BUILD/tests/multi_client"
G0=GPU-00000000-0000-0000-0000-000000000000
G1=GPU-00000000-0000-0000-0000-000000000001
M0=$TMP/multi0 M1=$TMP/multi1
mkdir -p "$M0" "$M1"
run_multi() { # VAR=VALUE... -- multi_client args: two devices, both GPUs listed, each its own socket
    run_client GPUSHARE_STUB_DEVICES=2 GPUSHARE_GPU_UUID="$G0,$G1" GPUSHARE_SOCKET="$G0=$M0/s.sock,$G1=$M1/s.sock" "$@"
}
start_two() { # fake0-args -- fake1-args: a scripted scheduler per GPU
    local a=() b=()
    rm -f "$M0/s.sock" "$M1/s.sock" # the last ones' sockets would pass start_fake's wait before the new bind
    while [ "$1" != -- ]; do a+=("$1"); shift; done
    shift
    start_fake "$M0" "${a[@]}"
    FAKE0=$FAKE
    start_fake "$M1" "$@"
    FAKE1=$FAKE
}
stop_two() { kill "$FAKE0" "$FAKE1" 2>/dev/null; wait "$FAKE0" "$FAKE1" 2>/dev/null || true; }

# Each GPU has its own limit: device 0 full is refused, device 1 is filled to its own limit, each
# cuMemGetInfo reports its GPU's, and a free gives back to the pointer's GPU whatever is current.
start_two -- 
out=$(run_multi GPUSHARE_MEMORY_LIMIT_BYTES="$G0=67108864,$G1=134217728" timeout 20 "$MULTI" cap 67108864 134217728 2>&1 || true)
if grep -q "multi cap d0_fill=0 d0_over=2 d0_total=67108864 d1_fill=0 d1_over=2 d1_total=134217728 refill=0" <<<"$out"; then
    pass "several GPUs: each has its own memory limit and cuMemGetInfo; a free returns to the pointer's GPU"
else
    fail "per-GPU limits" "$out"
fi
stop_two

# A launch on device 1 takes only device 1's lock: device 0's scheduler never grants, device 1 runs.
# Device 1's launch waits until device 0's thread asked for its lock.
start_two grant=0 -- 
rm -f "$M0/go"
run_multi timeout 20 "$MULTI" locks "$M0/go" >"$M0/out" 2>&1 &
pm=$!
wait_for 20 grep -q "got ACQUIRE; not granting" "$M0/sched.log" || true
touch "$M0/go"
wait "$pm" || true
out=$(cat "$M0/out")
if grep -q "multi locks dev1=0" <<<"$out" && grep -q "got ACQUIRE; not granting" "$M0/sched.log" &&
    grep -q "got ACQUIRE need=0; sent GRANT" "$M1/sched.log"; then
    pass "several GPUs: each GPU's work takes that GPU's lock only (device 1 runs while device 0 waits)"
else
    fail "per-GPU locks" "$out $(cat "$M0/sched.log" "$M1/sched.log")"
fi
stop_two

# Oversubscription on device 0 only: its cuMemGetInfo is the scheduler's budget, device 1's the driver's.
start_two budget=268435456 -- budget=268435456
out=$(run_multi GPUSHARE_OVERSUB="$G0=1,$G1=0" GPUSHARE_STUB_MEM_TOTAL=1073741824 timeout 20 "$MULTI" info 2>&1 || true)
if grep -q "multi info d0_total=268435456 d1_total=1073741824" <<<"$out"; then
    pass "several GPUs: oversubscription on one GPU only (its budget), the other GPU's memory unchanged"
else
    fail "per-GPU oversubscription" "$out"
fi
stop_two

# One process per GPU (NCCL's layout): each process connects only to its own GPU's scheduler.
start_two -- 
run_multi timeout 20 "$MULTI" launch 0 >"$M0/out" 2>&1 &
p0=$!
run_multi timeout 20 "$MULTI" launch 1 >"$M1/out" 2>&1 &
p1=$!
ok=1
wait "$p0" || ok=0
wait "$p1" || ok=0
if [ "$ok" = 1 ] && grep -q "multi launch dev=0 r=0" "$M0/out" && grep -q "multi launch dev=1 r=0" "$M1/out" &&
    [ "$(grep -c "got HELLO" "$M0/sched.log")" = 1 ] && [ "$(grep -c "got HELLO" "$M1/sched.log")" = 1 ]; then
    pass "several GPUs: one process per GPU, each served by its own GPU's scheduler"
else
    fail "one process per GPU" "$(cat "$M0/out" "$M1/out" "$M0/sched.log" "$M1/sched.log")"
fi
stop_two

# A malformed list (a GPU named twice in GPUSHARE_SOCKET) leaves the GPUs unshared, with a warning:
# the process runs, no scheduler hears from it.
start_two -- 
out=$(run_client GPUSHARE_STUB_DEVICES=2 GPUSHARE_GPU_UUID="$G0,$G1" GPUSHARE_SOCKET="$G0=$M0/s.sock,$G0=$M1/s.sock" \
    timeout 20 "$MULTI" launch 0 2>&1 || true)
out2=$(run_client GPUSHARE_STUB_DEVICES=2 GPUSHARE_GPU_UUID="$G0,$G1" GPUSHARE_SOCKET="$G0=$M0/s.sock" \
    timeout 20 "$MULTI" launch 1 2>&1 || true)
if grep -q "multi launch dev=0 r=0" <<<"$out" && grep -q "GPUSHARE_SOCKET does not parse as the list form" <<<"$out" &&
    grep -q "multi launch dev=1 r=0" <<<"$out2" && grep -q "GPUSHARE_SOCKET has no socket for $G1" <<<"$out2" &&
    ! grep -q "got HELLO" "$M0/sched.log" "$M1/sched.log"; then
    pass "several GPUs: a malformed list or a GPU without a socket passes through with a warning"
else
    fail "malformed list" "$out $out2 $(cat "$M0/sched.log" "$M1/sched.log")"
fi
stop_two

# 39. Oversubscription on both GPUs of one process: each GPU swaps against its own scheduler's budget.
# Device 0's scheduler grants 64 MiB, device 1's 16 MiB and evicts it to 0 at each release: each
# cuMemGetInfo reports its own budget, device 1 refuses to grow past its own, its idle release swaps out
# device 1's memory only (one swap out, of device 1's 12 MiB; device 0's scheduler never evicts), and
# every byte of both devices comes back.
rm -f "$M1/go"
start_two budget=67108864 -- budget=16777216 evict_on_release=1
run_multi GPUSHARE_OVERSUB="$G0=1,$G1=1" GPUSHARE_LOG_LEVEL=info GPUSHARE_IDLE_MS=20 \
    timeout 30 "$MULTI" oversub $((32 << 20)) $((12 << 20)) "$M1/go" >"$M1/out" 2>"$M1/err" &
pm=$!
ok=1
wait_for 20 grep -q "got USAGE reason=1 resident=0 swapped=12582912" "$M1/sched.log" || ok=0
cp "$M1/err" "$M1/err.evicted" # the swap's line comes before its USAGE
touch "$M1/go"
wait "$pm" || ok=0
if [ "$ok" = 1 ] && grep -q "multi oversub d0_total=67108864 d1_total=16777216 d1_over=2 intact=1" "$M1/out" &&
    [ "$(grep -c "swap out:" "$M1/err.evicted")" = 1 ] &&
    grep -q "swap out: 2 allocation(s), 12582912 bytes" "$M1/err.evicted" &&
    ! grep -q "EVICT" "$M0/sched.log" && ! grep -q "got USAGE .*swapped=[1-9]" "$M0/sched.log"; then
    pass "several GPUs: oversubscription on both, each GPU swapped against its own scheduler's budget"
else
    fail "oversubscription on two GPUs" "ok=$ok $(cat "$M1/out" "$M1/err" "$M0/sched.log" "$M1/sched.log")"
fi
stop_two

# 40. The launch bound per GPU: device 0's scheduler bounds launches at 4, device 1's sends none. The
# three launches on device 0's stream are paced; the three on a stream of device 1 (device 0 current)
# are not, and each scheduler hears its own GPU's bound (PACING).
start_two pace=4 -- 
rm -f "$M0/go"
run_multi GPUSHARE_LOG_LEVEL=info timeout 20 "$MULTI" launches 3 0 "$M0/go" >"$M0/out" 2>&1 &
pm=$!
wait_for 20 grep -q "got PACING max_queued=4" "$M0/sched.log" || true
wait_for 20 grep -q "got PACING max_queued=0" "$M1/sched.log" || true
touch "$M0/go"
wait "$pm" || true
out=$(cat "$M0/out")
if grep -q "multi launches r=0" <<<"$out" && grep -q "launch pacing: 3 launches paced" <<<"$out" &&
    grep -q "launch pacing on $G0: at most 4 launches outstanding" <<<"$out" &&
    grep -q "got PACING max_queued=4" "$M0/sched.log" && grep -q "got PACING max_queued=0" "$M1/sched.log" &&
    ! grep -q "got PACING max_queued=4" "$M1/sched.log"; then
    pass "several GPUs: each GPU's launches are paced by that GPU's scheduler's bound"
else
    fail "pacing per GPU" "$out $(cat "$M0/sched.log" "$M1/sched.log")"
fi
stop_two

# 41. Stream work follows the stream's GPU: with device 0 current (its scheduler never grants), a memset, a
# copy in and a copy out on a stream of device 1 take device 1's lock and run.
start_two grant=0 -- 
out=$(run_multi timeout 10 "$MULTI" acopy 2>&1 || true)
if grep -q "multi acopy r=0 intact=1" <<<"$out" && ! grep -q "got ACQUIRE" "$M0/sched.log" &&
    grep -q "got ACQUIRE need=0; sent GRANT" "$M1/sched.log"; then
    pass "several GPUs: async copies and memsets on a stream take the stream's GPU's lock"
else
    fail "stream work per GPU" "$out $(cat "$M0/sched.log" "$M1/sched.log")"
fi
stop_two

# 42. VMM on device 1 with device 0 current: the mapping, its access, a retained handle and the unmap are
# device 1's. Under device 1's limit the unmap gives its bytes back to device 1; with oversubscription on
# device 1 (device 0's scheduler never grants) each call takes device 1's lock and the memory is counted
# and freed there.
start_two -- 
out=$(run_multi GPUSHARE_MEMORY_LIMIT_BYTES="$G1=67108864" timeout 10 "$MULTI" vmm 2>&1 || true)
stop_two
start_two grant=0 -- budget=67108864
out2=$(run_multi GPUSHARE_OVERSUB="$G1=1" timeout 10 "$MULTI" vmm 2>&1 || true)
if grep -q "multi vmm r=0 used=8388608 after=0" <<<"$out" && grep -q "multi vmm r=0 used=8388608 after=0" <<<"$out2" &&
    ! grep -q "got ACQUIRE" "$M0/sched.log"; then
    pass "several GPUs: VMM map, access, retain and unmap find the handle's GPU whatever context is current"
else
    fail "VMM per GPU" "$out $out2 $(cat "$M0/sched.log" "$M1/sched.log")"
fi
stop_two

# 43. NVML per GPU: the stub NVML has both devices (by UUID); each device's NVML memory is its own limit
# and what this process allocated there (16 MiB on device 1, none on device 0).
start_two -- 
out=$(run_multi GPUSHARE_MEMORY_LIMIT_BYTES="$G0=1073741824,$G1=268435456" timeout 10 "$BUILD/tests/nvml_client" multi 2>&1 || true)
d0=1073741824/1073741824/0
d1=268435456/251658240/16777216
if grep -qx "nvml multi dev0 $d0 $d0 dev1 $d1 $d1" <<<"$out"; then
    pass "several GPUs: NVML reports each GPU's own limit and use"
else
    fail "NVML per GPU" "$out"
fi
stop_two

# 44. A copy finds the GPUs of the memory it touches: oversubscription on both GPUs, device 1's scheduler
# evicts at each release and, after its first grant, holds every GRANT back until the test allows it.
# Once device 1's memory is swapped out, with device 0 current, a copy of device 1's memory (dtoh) and a
# peer copy from device 0 to device 1 (peer) wait for device 1's grant (the copy has not returned while
# it is held back), then device 1's memory is swapped in and every byte is right.
xcopy() { # KIND VAR=VALUE...: multi_client xcopy KIND; 0 when it waited for device 1's grant and its bytes are right
    local kind=$1
    shift
    rm -f "$M1/go" "$M1/grant"
    start_two -- evict_on_release=1 grant_file="$M1/grant"
    run_multi GPUSHARE_OVERSUB="$G0=1,$G1=1" GPUSHARE_IDLE_MS=20 "$@" \
        timeout 20 "$MULTI" xcopy "$kind" $((1 << 20)) "$M1/go" >"$M1/out" 2>"$M1/err" &
    local pm=$! ok=1
    wait_for 20 grep -q "got USAGE reason=1 resident=0 swapped=[1-9]" "$M1/sched.log" || ok=0
    touch "$M1/go"
    wait_for 20 grep -q "holding the GRANT back" "$M1/sched.log" || ok=0
    grep -q "multi xcopy $kind r=" "$M1/out" && ok=0 # done without device 1's grant
    touch "$M1/grant"
    wait "$pm" || ok=0
    grep -q "multi xcopy $kind r=0 intact=1" "$M1/out" || ok=0
    stop_two
    return $((1 - ok))
}
if xcopy dtoh; then
    pass "several GPUs: a copy of device 1's swappable memory with device 0 current waits for device 1's lock"
else
    fail "copy of another GPU's memory" "$(cat "$M1/out" "$M1/err" "$M0/sched.log" "$M1/sched.log")"
fi
if xcopy peer; then
    pass "several GPUs: a peer copy between two GPUs' swappable memory waits for both GPUs' locks"
else
    fail "peer copy" "$(cat "$M1/out" "$M1/err" "$M0/sched.log" "$M1/sched.log")"
fi
# The same copy on a stream of device 0 (cuMemcpyDtoDAsync): device 1's lock too, and the copy is done
# before the call returns (device 1's release drains device 1's streams only); each copy takes 50 ms.
if xcopy async GPUSHARE_STUB_COPY_US=50000; then
    pass "several GPUs: a copy on one GPU's stream onto another GPU's swappable memory waits for both locks and is done on return"
else
    fail "async copy across GPUs" "$(cat "$M1/out" "$M1/err" "$M0/sched.log" "$M1/sched.log")"
fi

# Two threads copy at once in opposite directions (0->1 with device 0 current, 1->0 with device 1
# current), both GPUs' memory swapped out, device 1's grant held back until both wait: both finish
# and every byte is right.
rm -f "$M0/go" "$M1/grant"
start_two evict_on_release=1 -- evict_on_release=1 grant_file="$M1/grant"
run_multi GPUSHARE_OVERSUB="$G0=1,$G1=1" GPUSHARE_IDLE_MS=20 \
    timeout 20 "$MULTI" cross $((1 << 20)) "$M0/go" >"$M0/out" 2>"$M0/err" &
pm=$!
ok=1
wait_for 20 grep -q "got USAGE reason=1 resident=0 swapped=[1-9]" "$M0/sched.log" || ok=0
wait_for 20 grep -q "got USAGE reason=1 resident=0 swapped=[1-9]" "$M1/sched.log" || ok=0
touch "$M0/go"
wait_for 20 grep -q "holding the GRANT back" "$M1/sched.log" || ok=0
touch "$M1/grant"
wait "$pm" || ok=0
if [ "$ok" = 1 ] && grep -q "multi cross r=0 intact=1" "$M0/out"; then
    pass "several GPUs: two threads copying between two GPUs in opposite directions both finish"
else
    fail "opposite copies" "ok=$ok $(cat "$M0/out" "$M0/err" "$M0/sched.log" "$M1/sched.log")"
fi
stop_two

# 45. A plain allocation of device 1 (no oversubscription: the shim's tables do not hold it), read with
# device 0 current. Device 1's lock is released once idle, then its next GRANT is held back until the
# test allows it. A synchronous read (cuMemcpyDtoH) waits for device 1's lock too: the driver names the
# pointer's device, and the copy has not returned meanwhile. The same read on a stream of device 0
# (cuMemcpyDtoHAsync) runs on device 0: it neither asks for device 1's lock nor waits for it.
plaincopy() { # KIND WAITS: 0 when the read waited for device 1's grant (WAITS 1) or finished without asking (WAITS 0), its bytes right
    local kind=$1 waits=$2 ok=1 pm
    rm -f "$M1/go" "$M1/grant"
    start_two -- grant_file="$M1/grant"
    run_multi GPUSHARE_IDLE_MS=20 timeout 20 "$MULTI" xcopy "$kind" $((1 << 20)) "$M1/go" >"$M1/out" 2>"$M1/err" &
    pm=$!
    wait_for 20 grep -q "multi xcopy ready" "$M1/out" || ok=0
    wait_for 20 grep -q "got RELEASE" "$M1/sched.log" || ok=0
    touch "$M1/go"
    if [ "$waits" = 1 ]; then
        wait_for 20 grep -q "holding the GRANT back" "$M1/sched.log" || ok=0
        grep -q "multi xcopy $kind r=" "$M1/out" && ok=0 # done without device 1's grant
    else
        wait_for 20 grep -q "multi xcopy $kind r=" "$M1/out" || ok=0
        grep -q "holding the GRANT back" "$M1/sched.log" && ok=0 # asked for device 1's lock
    fi
    touch "$M1/grant"
    wait "$pm" || ok=0
    grep -q "multi xcopy $kind r=0 intact=1" "$M1/out" || ok=0
    stop_two
    return $((1 - ok))
}
if plaincopy plain 1; then
    pass "several GPUs: a copy of device 1's plain allocation with device 0 current waits for device 1's lock"
else
    fail "plain copy of another GPU's memory" "$(cat "$M1/out" "$M1/err" "$M0/sched.log" "$M1/sched.log")"
fi
if plaincopy plainasync 0; then
    pass "several GPUs: a copy of device 1's plain allocation on a stream of device 0 takes device 0's lock only"
else
    fail "plain copy on another GPU's stream" "$(cat "$M1/out" "$M1/err" "$M0/sched.log" "$M1/sched.log")"
fi

if [ "$fails" -ne 0 ]; then
    echo "$fails shim test(s) failed"
    exit 1
fi
echo "all shim tests passed"
