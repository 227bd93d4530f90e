#!/usr/bin/env bash
# Per-process accounting on the real GPU against nvidia-smi: two PyTorch processes (6 GiB busy all the
# time, 3 GiB busy 30% of each second) run while acctcheck reads them through agent/accounting over
# NVML and compares with nvidia-smi --query-compute-apps and pmon. Run from the repository root on the
# GPU machine, with test/gpu/accounting/bin/acctcheck built on a machine with Go (make acctcheck-bin) and copied along.
set -u
OUT=${OUT:-$(mktemp -d)}
bin=test/gpu/accounting/bin/acctcheck
[ -x "$bin" ] || { echo "FAIL $bin missing: build it with make acctcheck-bin and copy test/gpu/accounting/bin along"; exit 3; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
export PYTHONUNBUFFERED=1
python3 test/gpu/accounting/workload.py 6 1.0 >"$OUT/a.log" 2>&1 & a=$!
python3 test/gpu/accounting/workload.py 3 0.3 >"$OUT/b.log" 2>&1 & b=$!
cleanup() { kill "$a" "$b" 2>/dev/null; wait "$a" "$b" 2>/dev/null; }
trap cleanup EXIT
for _ in $(seq 120); do
  grep -q ready "$OUT/a.log" 2>/dev/null && grep -q ready "$OUT/b.log" 2>/dev/null && break
  sleep 0.5
done
grep -q ready "$OUT/a.log" && grep -q ready "$OUT/b.log" || { echo "FAIL workloads did not start"; cat "$OUT"/a.log "$OUT"/b.log; exit 1; }
sleep 3 # allocator settles
rc=0
"$bin" -pids "$a,$b" -duration "${DURATION:-40s}" -interval "${INTERVAL:-2s}" || rc=$?
cleanup
trap - EXIT
sleep 2
left=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -E "^($a|$b)$" || true)
[ -z "$left" ] && echo "PASS workloads gone" || { echo "FAIL left running: $left"; rc=1; }
exit $rc
