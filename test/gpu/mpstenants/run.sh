#!/usr/bin/env bash
# Two namespaces' MPS daemons on one real GPU through the agent's MPS manager (docs/mps.md): each daemon
# started as the agent starts it (mps-launch, its own tmpfs as /dev/shm), one CUDA client per namespace
# at the same time, each in a mount namespace with only its namespace's pipe directory and tmpfs at the
# container paths. Run it as root on the GPU machine from the repository root, with test/gpu/mpstenants/bin
# copied along (the GPU machine has no Go: build it elsewhere):
#   CGO_ENABLED=0 go build -o test/gpu/mpstenants/bin/drive ./test/gpu/mpstenants/drive
# The client is test/gpu/agent/mps_client.py (PyTorch). The GPU machine is shared: this changes nothing
# but two MPS daemons in a temp folder, quit before the script ends; it needs compute mode Default (it
# never sets a compute mode) and skips otherwise.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$here/results}
mkdir -p "$out"
uuid0=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0)
mode=$(nvidia-smi --query-gpu=compute_mode --format=csv,noheader -i 0)
nvidia-smi --query-gpu=index,uuid,name,driver_version,mig.mode.current,compute_mode --format=csv | tee "$out/nvidia-smi.csv"
if [ "$mode" != "Default" ]; then
	echo "SKIP GPU 0 is in compute mode $mode; several MPS daemons on one GPU need Default"
	exit 0
fi
mpsroot=$(mktemp -d /tmp/gpusharing-mps.XXXXXX)
quit_daemons() { # safety net: whatever the driver left, quit it through its own pipe
	for d in "$mpsroot/$uuid0"/ns/*; do
		[ -e "$d/pipe/nvidia-cuda-mps-control.pid" ] || continue
		echo quit | CUDA_MPS_PIPE_DIRECTORY=$d/pipe CUDA_MPS_LOG_DIRECTORY=$d/log nvidia-cuda-mps-control || true
	done
}
trap quit_daemons EXIT

"$here/bin/drive" --root "$mpsroot" --uuid "$uuid0" --client "python3 $here/../agent/mps_client.py" > "$out/tenants.json"
cat "$out/tenants.json"
python3 - "$out/tenants.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
ts = {t["namespace"]: t for t in r.get("tenants") or []}
a, b = ts.get("team-a", {}), ts.get("team-b", {})
servers = [s for t in (a, b) for s in (t.get("servers") or [])]
apps = " ".join(r.get("computeAppsWhileHeld") or [])
checks = [
    ("two namespace daemons ran", a.get("daemonPid", 0) > 0 and b.get("daemonPid", 0) > 0 and a["daemonPid"] != b["daemonPid"]),
    ("each daemon ran its own MPS server while both clients held their contexts", len(a.get("servers") or []) == 1 and len(b.get("servers") or []) == 1 and len(set(servers)) == 2),
    ("the GPU showed both servers at once", all(str(s) in apps for s in servers) and apps.count("nvidia-cuda-mps-server") >= 2),
    ("each client allocated its 1024 MiB", all((t.get("client") or {}).get("allocated_mib") == 1024 for t in (a, b))),
    ("each client exited cleanly", a.get("clientExit") == "0" and b.get("clientExit") == "0"),
    ("each daemon counted its own client", a.get("clientsCounted") == 1 and b.get("clientsCounted") == 1),
    ("both daemons quit and their directories removed", a.get("directoryRemovedAfterStop") and b.get("directoryRemovedAfterStop") and not r.get("leftoverProcesses")),
    ("no errors", not r.get("errors")),
]
# What MPS keeps by name in a daemon's /dev/shm while a client runs is the driver's business (driver 580
# keeps nothing named there): reported, not checked.
print("INFO named files in each namespace's /dev/shm while its client ran:",
      {t: len((ts.get(t) or {}).get("shmFilesWhileHeld") or []) for t in ("team-a", "team-b")})
fails = 0
for name, ok in checks:
    print("PASS" if ok else "FAIL", name)
    fails += not ok
sys.exit(1 if fails else 0)
PY
rc=$?
nvidia-smi --query-gpu=index,uuid,name,driver_version,mig.mode.current,compute_mode --format=csv > "$out/nvidia-smi-after.csv"
if cmp -s "$out/nvidia-smi.csv" "$out/nvidia-smi-after.csv"; then echo "PASS GPU state unchanged"; else echo "FAIL GPU state changed"; rc=1; fi
rm -rf "$mpsroot"
exit $rc
