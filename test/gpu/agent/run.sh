#!/usr/bin/env bash
# The agent on a real GPU, read-only except for one MPS daemon in a temp folder. Run it on the GPU machine
# from the repository root, with test/gpu/agent/bin copied along (the GPU machine has no Go: build them
# elsewhere):
#   CGO_ENABLED=1 go build -o test/gpu/agent/bin/agent ./cmd/agent
#   CGO_ENABLED=1 go build -o test/gpu/agent/bin/mpsdrive ./test/gpu/agent/mpsdrive
# The GPU machine is shared: never change MIG mode, compute mode or the time-slice policy, never reset the GPU; the MPS
# daemon uses its own pipe/log dirs and is quit before the script ends; no managed memory.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$here/bin
out=${OUT:-$(mktemp -d)}
fails=0
check() { # check NAME CONDITION-COMMAND...
	local name=$1; shift
	if "$@"; then echo "PASS $name"; else echo "FAIL $name"; fails=$((fails + 1)); fi
}

uuid0=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0)
mpsroot=$(mktemp -d /tmp/gpusharing-mps.XXXXXX)
pipe=$mpsroot/$uuid0/pipe
quit_daemon() { # safety net: whatever the driver left, quit it through its own pipe
	if [ -e "$pipe/nvidia-cuda-mps-control.pid" ]; then
		echo quit | CUDA_MPS_PIPE_DIRECTORY=$pipe CUDA_MPS_LOG_DIRECTORY=$mpsroot/$uuid0/log nvidia-cuda-mps-control || true
	fi
}
trap quit_daemon EXIT

echo "== GPU"
nvidia-smi --query-gpu=index,uuid,name,memory.total,driver_version,mig.mode.current,compute_mode --format=csv | tee "$out/nvidia-smi.csv"

echo "== inventory (NVML through the agent) vs nvidia-smi"
"$bin/agent" inventory > "$out/inventory.json"
check "agent inventory runs" test -s "$out/inventory.json"
python3 - "$out/inventory.json" <<'PY'
import json, subprocess, sys
inv = json.load(open(sys.argv[1]))
q = "index,uuid,name,memory.total,driver_version,mig.mode.current,compute_mode"
rows = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits"], capture_output=True, text=True, check=True).stdout.strip().splitlines()
modes = {"Default": "Default", "Exclusive_Process": "ExclusiveProcess", "Prohibited": "Prohibited"}
ok = len(rows) == len(inv["devices"])
print(("PASS" if ok else "FAIL"), f"gpu count {len(inv['devices'])} vs nvidia-smi {len(rows)}")
for row, d in zip(rows, inv["devices"]):
    idx, uuid, name, mem, drv, mig, cm = [c.strip() for c in row.split(",")]
    checks = {
        "index": (int(idx), d["index"]), "uuid": (uuid, d["uuid"]), "name": (name, d["product"]),
        "memory MiB": (int(mem), d["memoryBytes"] >> 20), "driver": (drv, inv["driverVersion"]),
        "mig.mode.current": (mig, "Enabled" if d["migMode"]["current"] else ("Disabled" if d["migCapable"] else "[N/A]")),
        "compute mode": (modes.get(cm, cm), d["computeMode"]),
    }
    for k, (want, got) in checks.items():
        print("PASS" if want == got else "FAIL", f"GPU {idx} {k}: nvidia-smi {want!r} agent {got!r}")
    for p in d.get("profiles", []):
        print(f"     profile {p['name']:12s} id {p['id']:2d} slices {p['sliceCount']} mem {p['memoryMB']} MiB max {p['maxInstances']} placements " +
              " ".join(f"{pl['start']}+{pl['size']}" for pl in p["placements"]))
PY

echo "== MIG plans against the real profiles (read-only)"
layouts_fit=("7g.80gb x1" "3g.40gb x2" "3g.40gb x1 + 1g.10gb x4" "4g.40gb x1 + 3g.40gb x1" "2g.20gb x3 + 1g.10gb x1" "1g.10gb x7" "1g.20gb x4" "3g.40gb x1 + 2g.20gb x2" "2g.20gb x3 + 1g.20gb x1" "1g.10gb+me x1 + 1g.10gb x6")
layouts_nofit=("3g.40gb x2 + 1g.10gb x1" "4g.40gb x1 + 3g.40gb x1 + 1g.10gb x1" "1g.20gb x4 + 1g.10gb x1" "2g.20gb x4" "5g.60gb x1" "4g.40gb x1 + 1g.20gb x2 + 1g.10gb x1")
"$bin/agent" plan --gpu 0 "${layouts_fit[@]}" > "$out/plans-fit.jsonl"
"$bin/agent" plan --gpu 0 "${layouts_nofit[@]}" > "$out/plans-nofit.jsonl"
python3 - "$out/inventory.json" "$out/plans-fit.jsonl" "$out/plans-nofit.jsonl" <<'PY'
import json, sys
inv = json.load(open(sys.argv[1]))
profiles = {p["name"]: p for p in inv["devices"][0].get("profiles", [])}
def valid(plan):
    used = []
    for c in plan["create"]:
        pl = c["placement"]
        if pl not in profiles[c["profile"]]["placements"]:
            return f"{c['profile']} at {pl} is not a placement NVML offers"
        for u in used:
            if pl["start"] < u["start"] + u["size"] and u["start"] < pl["start"] + pl["size"]:
                return f"{c['profile']} at {pl} overlaps {u}"
        used.append(pl)
    return None
for path, want_fit in ((sys.argv[2], True), (sys.argv[3], False)):
    for line in open(path):
        p = json.loads(line)
        problem = None
        if p["fits"] != want_fit:
            problem = f"fits={p['fits']}, expected {want_fit}"
        elif want_fit:
            problem = valid(p)
        where = " ".join(f"{c['profile']}@{c['placement']['start']}" for c in p.get("create", [])) or p.get("message", "")
        print("FAIL" if problem else "PASS", f"plan {p['layout']!r}: {problem or where}")
PY

echo "== MPS for real on GPU 0 (pipe/log in $mpsroot)"
# The first client tries to go past the 4 GiB limit, but never past what the GPU really has free.
physfree=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits -i 0)
cap=$(( physfree - 2048 < 8192 ? physfree - 2048 : 8192 ))
echo "GPU 0 free: $physfree MiB; client 1 may try $cap MiB"
# Control: without a daemon on its pipe directory the same client is not limited.
nompspipe=$(mktemp -d /tmp/gpusharing-nomps.XXXXXX)
CUDA_MPS_PIPE_DIRECTORY=$nompspipe python3 "$here/mps_client.py" "$cap" 0 | tee "$out/control-client.json"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("PASS" if r["allocated_mib"] > 4096 else "FAIL", "without MPS the client allocates", r["allocated_mib"], "MiB")' "$out/control-client.json"
"$bin/mpsdrive" --root "$mpsroot" --uuid "$uuid0" --threads 50 --limit-mib 4096 --cap-mib "$cap" \
	--client "python3 $here/mps_client.py" > "$out/mps.json"
cat "$out/mps.json"
python3 - "$out/mps.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
c1, c2 = r.get("client1") or {}, r.get("client2") or {}
checks = [
    ("daemon started by the manager", r.get("firstDaemonPid", 0) > 0),
    ("default active thread percentage is 50", r.get("defaultActiveThreadPercentage", "").startswith("50")),
    ("client 1 stopped below the 4 GiB pinned limit", 0 < c1.get("allocated_mib", 0) <= 4096 and c1.get("oom") is not None),
    ("the manager counted the client", r.get("clientsCountedWhileHeld", 0) >= 1),
    ("killed daemon restarted by the manager", r.get("secondDaemonPid", 0) > 0 and r.get("restarts", 0) >= 1),
    ("client 2 works under the restarted daemon", c2.get("allocated_mib", 0) > 0),
    ("daemon quit at the end, nothing left", r.get("quitOk") and not r.get("leftoverProcesses")),
    ("no errors", not r.get("errors")),
]
for name, ok in checks:
    print("PASS" if ok else "FAIL", name)
PY

echo "== after: GPU state unchanged"
nvidia-smi --query-gpu=index,uuid,name,memory.total,driver_version,mig.mode.current,compute_mode --format=csv > "$out/nvidia-smi-after.csv"
check "MIG mode and compute mode unchanged" cmp -s "$out/nvidia-smi.csv" "$out/nvidia-smi-after.csv"
echo "fails in shell checks: $fails"
