#!/usr/bin/env bash
# The shim's memory limit (GPUSHARE_MEMORY_LIMIT_BYTES) on a GPU machine.
#
# 1. Its cost: cap_bench.py (an allocation-heavy loop with PyTorch's caching allocator off, and a
#    normal training step) under the shim without a limit and with one it never reaches (64 GiB),
#    alternately, ROUNDS rounds, each a fresh process; prints each round's times and the median ratio.
# 2. Its effect: two processes at once under the shim, A with an 8 GiB limit filling memory until
#    torch.OutOfMemoryError, B with 16 GiB holding 12 GiB and computing; both print mem_get_info and
#    NVML's answer. Then nvidia-smi under the shim with an 8 GiB limit.
# No scheduler runs: the shim passes GPU calls through (one warning per process), which is where
# the limit's own cost shows; the limit does not depend on the scheduler.
#
#   test/gpu/cap/run.sh [LOG]        (from the repository root; LOG defaults to stdout)
# Needs: nvidia-smi, python3 with torch, gcc (the shim is built here). Knobs: ROUNDS (default 5).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
HERE=$ROOT/test/gpu/cap
SHIM=$ROOT/shim/build/libgpushare.so
ROUNDS=${ROUNDS:-5}
[ $# -ge 1 ] && exec > >(tee "$1") 2>&1
make -s -C "$ROOT/shim" all >/dev/null || exit 1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
echo "cap: $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i 0)" \
    "torch $(python3 -c 'import torch; print(torch.__version__, torch.version.cuda)')"
BIG=$((64 << 30))
run_bench() { # mode limit
    local lim=()
    [ "$2" != 0 ] && lim=(GPUSHARE_MEMORY_LIMIT_BYTES="$2")
    local cache=()
    [ "$1" = alloc ] && cache=(PYTORCH_NO_CUDA_MEMORY_CACHING=1)
    env "${cache[@]}" "${lim[@]}" LD_PRELOAD="$SHIM" python3 "$HERE/cap_bench.py" --mode "$1" 2>/dev/null | tail -1 |
        python3 -c 'import json,sys; print("%.4f" % list(json.loads(sys.stdin.read()).values())[0])'
}
for mode in alloc train; do
    echo "== $mode: LD_PRELOAD=$SHIM [GPUSHARE_MEMORY_LIMIT_BYTES=$BIG]$([ $mode = alloc ] && echo ' PYTORCH_NO_CUDA_MEMORY_CACHING=1') python3 test/gpu/cap/cap_bench.py --mode $mode"
    ratios=()
    for r in $(seq "$ROUNDS"); do
        if [ $((r % 2)) = 1 ]; then u=$(run_bench $mode 0); c=$(run_bench $mode $BIG); else c=$(run_bench $mode $BIG); u=$(run_bench $mode 0); fi
        ratio=$(python3 -c "print('%.4f' % ($c / $u))" 2>/dev/null || echo nan)
        ratios+=("$ratio")
        echo "round $r: uncapped ${u} ms/step, capped ${c} ms/step, capped/uncapped $ratio"
    done
    echo "$mode: median capped/uncapped $(printf '%s\n' "${ratios[@]}" | sort -n | sed -n "$(((ROUNDS + 1) / 2))p") over $ROUNDS rounds"
done

echo "== two processes: A limit 8 GiB fills until OOM, B limit 16 GiB holds 12 GiB and computes"
env LD_PRELOAD="$SHIM" GPUSHARE_MEMORY_LIMIT_BYTES=$((16 << 30)) python3 "$HERE/cap_demo.py" --name B --dir "$WORK" --hold 12 >"$WORK/B.out" 2>"$WORK/B.err" &
BP=$!
sleep 8
env LD_PRELOAD="$SHIM" GPUSHARE_MEMORY_LIMIT_BYTES=$((8 << 30)) python3 "$HERE/cap_demo.py" --name A --dir "$WORK" --fill >"$WORK/A.out" 2>"$WORK/A.err"
echo "A exit $?"
wait $BP
echo "B exit $?"
cat "$WORK/A.out" "$WORK/B.out"
grep -h -v "GPU lock disabled" "$WORK/A.err" "$WORK/B.err" | tail -8
echo "== nvidia-smi under the shim with an 8 GiB limit, then without the shim"
env LD_PRELOAD="$SHIM" GPUSHARE_MEMORY_LIMIT_BYTES=$((8 << 30)) nvidia-smi --query-gpu=memory.total,memory.used,memory.free --format=csv 2>&1 | grep -v "GPU lock disabled"
nvidia-smi --query-gpu=memory.total,memory.used,memory.free --format=csv
