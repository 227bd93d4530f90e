#!/usr/bin/env bash
# Where a pair's time goes (GPU machine): timestamps of start-up phases alone, two at once without the
# shim, one with the shim, and a heavy pair with debug logs. Writes $OUT/probe.log and $OUT/probe-logs.tgz.
#   STEPS=1500 PAIR_STEPS=3000 QUANTUM=5s test/gpu/oversub/probe.sh
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
OUT=${OUT:-/tmp/probe-out}; mkdir -p "$OUT"
BUILD=$ROOT/shim/build
STEPS=${STEPS:-1500}; PAIR_STEPS=${PAIR_STEPS:-3000}; QUANTUM=${QUANTUM:-5s}
TRAIN=$ROOT/test/gpu/oversub/train.py
W=$(mktemp -d)
exec > >(tee "$OUT/probe.log") 2>&1
make -s -C "$ROOT/shim" all || exit 1
UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0 | tr -d ' ')
SHIM=(env CUDA_VISIBLE_DEVICES=0 LD_PRELOAD="$BUILD/libgpushare.so" GPUSHARE_SOCKET="$W/$UUID.sock" GPUSHARE_GPU_UUID="$UUID" GPUSHARE_OVERSUB=1 GPUSHARE_LOG_LEVEL=${LOGLEVEL:-debug})
phases() { python3 - "$@" <<'PY'
import json, sys
l = float(sys.argv[1])
for f in sys.argv[2:]:
    d = json.loads([x for x in open(f) if x.startswith("{")][-1])
    print("  %-14s launch->start %.2f import %.2f ready(alloc+model) %.2f ->loop %.2f loop %.2f end->json %.2f sha %s ok %s" % (
        f.split("/")[-1], d["t_start"] - l, d["t_import"] - d["t_start"], d["t_ready"] - d["t_import"],
        d["loop_start"] - d["t_ready"], d["loop_seconds"], d["t_import"] + d["seconds"] - d["loop_end"], d["sha256"][:12], d["ballast_ok"]))
PY
}
now() { date +%s.%N; }
python3 -c 'import torch' # warm the page cache: a cold import takes seconds more
PARTS=${PARTS:-"A B C D"}
part() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
part A && { echo "== A: plain alone"; t=$(now); CUDA_VISIBLE_DEVICES=0 python3 "$TRAIN" --ballast-gb 5.75 --steps "$STEPS" >"$W/a.json" 2>"$W/a.err"; e=$(now)
echo "  wall $(awk -v a=$t -v b=$e 'BEGIN{print b-a}')"; phases "$t" "$W/a.json"; }
part B && { echo "== B: two plain at once"; t=$(now)
CUDA_VISIBLE_DEVICES=0 python3 "$TRAIN" --ballast-gb 5.75 --steps "$STEPS" >"$W/b1.json" 2>"$W/b1.err" & P1=$!
CUDA_VISIBLE_DEVICES=0 python3 "$TRAIN" --ballast-gb 5.75 --steps "$STEPS" >"$W/b2.json" 2>"$W/b2.err" & P2=$!
wait $P1 $P2; e=$(now)
echo "  wall $(awk -v a=$t -v b=$e 'BEGIN{print b-a}')"; phases "$t" "$W/b1.json" "$W/b2.json"; }
"$BUILD/gpushare-scheduler" --socket-dir "$W" --gpu "$UUID:$QUANTUM::8Gi:Auto" -v 1 2>"$W/sched.log" & SP=$!
for _ in $(seq 100); do [ -S "$W/$UUID.sock" ] && break; sleep 0.05; done
part C && { echo "== C: one with the shim (budget 8 GiB)"; t=$(now); "${SHIM[@]}" python3 "$TRAIN" --ballast-gb 5.75 --steps "$STEPS" >"$W/c.json" 2>"$W/c.err"; e=$(now)
echo "  wall $(awk -v a=$t -v b=$e 'BEGIN{print b-a}')"; phases "$t" "$W/c.json"; }
part D && { echo "== D: heavy pair with the shim, $PAIR_STEPS steps, quantum $QUANTUM"; t=$(now); echo "  launch $t"
"${SHIM[@]}" python3 "$TRAIN" --ballast-gb 5.75 --steps "$PAIR_STEPS" >"$W/d1.json" 2>"$W/d1.err" & P1=$!
"${SHIM[@]}" python3 "$TRAIN" --ballast-gb 5.75 --steps "$PAIR_STEPS" >"$W/d2.json" 2>"$W/d2.err" & P2=$!
wait $P1 $P2; e=$(now)
echo "  wall $(awk -v a=$t -v b=$e 'BEGIN{print b-a}')"; phases "$t" "$W/d1.json" "$W/d2.json"; }
kill -INT $SP; wait $SP
grep -h "swap \(in\|out\)\|stats" "$W"/*.err | head -60
tar czf "$OUT/probe-logs.tgz" -C "$W" .
