#!/usr/bin/env bash
# The whole stack on the real GPU: etcd, kube-apiserver, the manager and the agent as processes on
# loopback, the agent on the real NVML and nvidia-cuda-mps-control, its device plugin registered with
# test/fakekubelet (this machine has no kubelet), policies applied with kubectl. One command,
# PASS/FAIL per check and the apply-to-Ready times; the log lands in $OUT (default a temp dir).
#
# No Go on the GPU machine: build on a machine with Go, then copy test/gpu/stack/bin (git-ignored) along:
#   make stack-bin            # xz-compressed etcd, kube-apiserver, kubectl, manager, agent, stackcheck
# and run it on the GPU machine, from the repository root:
#   test/gpu/stack/run.sh
# SCENARIOS=sized test/gpu/stack/run.sh runs only some of stackcheck's scenarios (comma-separated: mps,
# oversubscription, usage, sized, rightsizing; all but rightsizing by default). rightsizing runs
# test/gpu/rightsize/workload.py as pods of a ReplicaSet through the agent and the manager (about 2
# minutes of GPU time) and only when named: SCENARIOS=rightsizing test/gpu/stack/run.sh
# The GPU machine is shared: MIG mode, compute mode and the time-slice policy are never changed (the agent gets a
# refusing nvidia-smi; no policy asks for MIG or TimeSlicing), the GPU is never reset, MPS daemons live
# under a temporary directory and are quit before the script ends, and no managed memory is used.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
HERE=$ROOT/test/gpu/stack
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
exec > >(tee "$OUT/stack.log") 2>&1
fails=0
check() { # check NAME COMMAND...
	local name=$1; shift
	if "$@"; then echo "PASS $name"; else echo "FAIL $name"; fails=$((fails + 1)); fi
}
BIN=$(mktemp -d /tmp/gs-bin.XXXXXX)
DETAIL=$(mktemp -d /tmp/gs-out.XXXXXX) # component logs and each workload's output, packed into $OUT at the end
for f in "$HERE"/bin/*.xz; do
	case $f in
	*.tar.xz) xz -dc "$f" | tar xf - -C "$BIN" ;;
	*) xz -dc "$f" > "$BIN/$(basename "$f" .xz)" ;;
	esac
done
chmod +x "$BIN"/*
ls -la "$BIN"
GPU=${GPU:-0}
QUERY=index,uuid,name,memory.total,driver_version,mig.mode.current,compute_mode
nvidia-smi --query-gpu=$QUERY --format=csv -i "$GPU" | tee "$OUT/gpu-before.csv"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

echo "== shim library"
make -s -C "$ROOT/shim" all >"$OUT/shim-build.log" 2>&1
check "libgpushare.so built" test -s "$ROOT/shim/build/libgpushare.so"

echo "== the simulated GPU is this GPU: MIG profiles and placements re-read through NVML"
"$BIN/agent" inventory > "$OUT/inventory.json"
# Compared with the recording of the model the script runs on (the H100's agent inventory, or a
# test/gpu/mig/record.py recording in agent/gpu/nvmlmock/recordings/), and counted.
check "MIG profiles and placements equal the recording of this GPU" python3 - "$OUT/inventory.json" "$ROOT/agent/gpu/nvmlmock" "$GPU" <<'PY'
import glob, json, os, sys
live = json.load(open(sys.argv[1]))["devices"][int(sys.argv[3])]
# A recording names profiles as NVML does ("MIG 1g.18gb"), the agent without the prefix.
key = lambda name, pid, slices, mem, maxi, pls: (pid, (name or "").removeprefix("MIG "), slices, mem, maxi, tuple((x["start"], x["size"]) for x in pls))
recorded = None
inv = json.load(open(os.path.join(sys.argv[2], "inventories/h100-80gb-hbm3.json")))["devices"][0]
if inv["product"] == live["product"]:
    recorded, where = sorted(key(p["name"], p["id"], p["sliceCount"], p["memoryMB"], p["maxInstances"], p["placements"]) for p in inv["profiles"]), "inventories/h100-80gb-hbm3.json"
for f in sorted(glob.glob(os.path.join(sys.argv[2], "recordings/*.json"))):
    rec = json.load(open(f))["devices"][0]
    if recorded is None and rec["product"] == live["product"]:
        recorded, where = sorted(key(p.get("name"), p["id"], p["sliceCount"], p["memorySizeMB"], p["instanceCount"], p["placements"]) for p in rec["profiles"] if p["return"] == "SUCCESS"), f
if recorded is None:
    print(f"no recording of {live['product']!r}: run test/gpu/mig/record.py (agent/gpu/nvmlmock/recordings/README.md)")
    sys.exit(1)
lp = sorted(key(p["name"], p["id"], p["sliceCount"], p["memoryMB"], p["maxInstances"], p["placements"]) for p in live.get("profiles", []))
print(f"{live['product']}: {len(lp)} profiles live, {len(recorded)} in {where}, equal: {lp == recorded}")
if lp != recorded:
    print("  live:    ", lp, "\n  recorded:", recorded)
sys.exit(0 if lp == recorded else 1)
PY

echo "== the stack"
timeout 540 "$BIN/stackcheck" --repo "$ROOT" --assets "$BIN" --bin "$BIN" --shim-library "$ROOT/shim/build/libgpushare.so" \
	--out "$DETAIL" --gpu "$GPU" --timeout 520s --scenarios "${SCENARIOS:-all}"
rc=$?
check "stackcheck passed" test "$rc" -eq 0

echo "== after"
nvidia-smi --query-gpu=$QUERY --format=csv -i "$GPU" > "$OUT/gpu-after.csv"
check "MIG mode and compute mode unchanged" cmp -s "$OUT/gpu-before.csv" "$OUT/gpu-after.csv"
left=$(pgrep -f 'nvidia-cuda-mps|gpusharing|/tmp/gs-bin' | grep -v $$ || true)
check "nothing left running" test -z "$left"
# The agent mounts each MPS GPU's /dev/shm tmpfs (source gpusharing-mps-shm) and unmounts it when the GPU
# leaves MPS; stackcheck unmounts any a failed run left.
check "no MPS /dev/shm tmpfs left mounted" sh -c '! grep -q " gpusharing-mps-shm " /proc/self/mountinfo'
for f in "$DETAIL"/*.log; do echo "-- $(basename "$f") (last lines)"; tail -n 5 "$f"; done
tar -C "$DETAIL" -czf "$OUT/stack-detail.tar.gz" .
rm -rf "$BIN" "$DETAIL"
echo "shell checks failed: $fails"
[ "$rc" -eq 0 ] && [ "$fails" -eq 0 ]
