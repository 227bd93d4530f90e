#!/usr/bin/env bash
# The unmanaged check on a GPU machine: umcheck runs the shim's scheduler on GPU 0's socket, the agent's
# accounting over real NVML with the scheduler's clients, and the check (agent/guard) every 2 s with the
# agent's 5 s grace. Beside it, three PyTorch processes hold 1 GiB each for 30 s:
#   client  - a pod's process under the shim (LD_PRELOAD, GPUSHARE_SOCKET): a client, never named;
#   dropper - a pod's process without LD_PRELOAD: named within the grace and one read of NVML listing it
#             (at most 9 s from its context, docs/accounting.md);
#   host    - a process of no pod: counted, never named.
# A process is of a pod here when its environment has UMCHECK_POD (no kubelet on the GPU machine).
# Prints umcheck's reads and one PASS/FAIL line per check; exit status 1 on any FAIL.
#
#   test/gpu/unmanaged/run.sh [LOG]     (from the repository root)
# Needs: nvidia-smi, python3 with torch, gcc; test/gpu/unmanaged/bin/umcheck, built where Go is:
#   make unmanaged-bin   (CGO_ENABLED=1 go build -o test/gpu/unmanaged/bin/umcheck ./test/gpu/unmanaged/umcheck)
# Knobs: GRACE (default 5s), HOLD (seconds, default 30), BYTES (default 1 GiB).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
HERE=$ROOT/test/gpu/unmanaged
SHIM=$ROOT/shim/build/libgpushare.so
GRACE=${GRACE:-5s}
HOLD=${HOLD:-30}
BYTES=${BYTES:-$((1 << 30))}
[ $# -ge 1 ] && exec > >(tee "$1") 2>&1
make -s -C "$ROOT/shim" all >/dev/null || exit 1
[ -x "$HERE/bin/umcheck" ] || { echo "FAIL $HERE/bin/umcheck missing: make unmanaged-bin where Go is, and carry it"; exit 1; }
WORK=$(mktemp -d)
UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0)
echo "unmanaged: $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i 0)" \
    "torch $(python3 -c 'import torch; print(torch.__version__, torch.version.cuda)')"
"$HERE/bin/umcheck" -socket-dir "$WORK" -gpu "$UUID" -grace "$GRACE" -duration "$((HOLD + 8))s" \
    -expect-named dropper -never client >"$WORK/umcheck.out" 2>"$WORK/umcheck.err" &
CHECK=$!
trap 'kill $CHECK 2>/dev/null; for p in $(jobs -p); do kill $p 2>/dev/null; done; rm -rf "$WORK"' EXIT
SOCK=$WORK/$UUID.sock
for _ in $(seq 50); do [ -S "$SOCK" ] && break; sleep 0.1; done
[ -S "$SOCK" ] || { echo "FAIL umcheck did not listen: $(cat "$WORK/umcheck.out" "$WORK/umcheck.err")"; exit 1; }

UMCHECK_POD=client GPUSHARE_SOCKET="$SOCK" GPUSHARE_GPU_UUID="$UUID" LD_PRELOAD="$SHIM" \
    python3 "$HERE/workload.py" "$BYTES" "$HOLD" >"$WORK/client.out" 2>"$WORK/client.err" &
UMCHECK_POD=dropper python3 "$HERE/workload.py" "$BYTES" "$HOLD" >"$WORK/dropper.out" 2>"$WORK/dropper.err" &
python3 "$HERE/workload.py" "$BYTES" "$HOLD" >"$WORK/host.out" 2>"$WORK/host.err" &
wait "$CHECK"
rc=$?
CHECK=
for w in client dropper host; do
    echo "$w: $(tr '\n' ' ' <"$WORK/$w.out") $(grep -i -e gpushare -e error "$WORK/$w.err" | tail -2 | tr '\n' ' ')"
done
cat "$WORK/umcheck.out"
[ -s "$WORK/umcheck.err" ] && { echo "umcheck log:"; tail -5 "$WORK/umcheck.err"; }
exit "$rc"
