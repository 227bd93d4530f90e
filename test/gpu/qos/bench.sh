#!/usr/bin/env bash
# make bench-qos (GPU machine): production inference beside opportunistic ResNet-50 training, side by side
# in one run, in each way this GPU can share:
#   alone       production only (the p50/p99 every ratio is against); solo: the trainer only
#   timeslice   both processes, plain (the driver's time-slicing between contexts)
#   mps         both MPS clients of one daemon
#   mps-prio    the same, the trainer at CUDA_MPS_CLIENT_PRIORITY=1
#   mps-alone   production alone as an MPS client: what MPS itself costs it
#   gs-mps      what gpusharing gives an opportunistic pod on an MPS GPU with sharing.qos: client priority 1
#               and opportunisticThreadPercentage (QOS_MPS_THREADS, default 50; gs-mps-tN: N)
#   gs-shim     gpusharing's shim on both (oversubscription on, memory fits), as the product sets it up:
#               production preempts the trainer's lock at once; while production is busy the trainer keeps
#               at most QUEUE_US of GPU time queued (PACE_TIME, default 500 as in the product; gs-shim-qN:
#               N us), launches not timed yet keeping to PACE launches (default 3; gs-shim-pN: N); production
#               releases once its work completed and SETTLE_US passed without a GPU call (SETTLE, default 100
#               as in the product; gs-shim-sN: N us), at the latest after the scheduler's idle window (1 ms)
#               or IDLE_US when shorter (gs-shim-iN: N us; gs-shim-fN: the trainer's GPUSHARE_PACE_FULL_US=N;
#               several: gs-shim-qN-sM)
#   gs-shim-window  the same build with the scheduler's earlier terms (--settle-floor 0
#               --opportunistic-queue-time 0): production releases after the 1 ms idle window, the trainer's
#               queue bounded in PACE launches: what release on completion and the bound in GPU time change
#   gs-shim-base gs-shim with another build of the shim (BASE_SHIM=path of its libgpushare.so): a shim change
#               side by side with the build it changes
#   gs-mps-shim the shim's lock on an MPS GPU, which gpusharing does not set up (docs/qos.md says why):
#               gs-shim's setup under one MPS daemon, the trainer at client priority 1 besides (gs-mps-shim-tN:
#               and N % of the threads)
#   gs-alone    production alone under the shim as gs-shim sets it up (no trainer): with no trainer connected
#               the scheduler leaves production its own idle window; IDLE_US=1000 measures what the lock's
#               hand-offs cost by themselves (production releases after 1 ms idle and asks again)
#   gs-oversub  the same with a memory budget production + two trainers exceed: the trainers swap between
#               themselves, production's memory stays resident
#   gs-solo     the trainer alone under the shim, its queue bounded as beside production (QUEUE_US of GPU
#               time, GPUSHARE_PACE_TIME_OVERRIDE_US, with PACE launches for kinds not timed yet): what the
#               bound itself costs the trainer; gs-solo-count: the bound in PACE launches alone, each weighed
#               by its run time up to GPUSHARE_PACE_FULL_US (gs-solo-fN: N us, gs-solo-f0: each counts as one)
# Production serves ResNet-50 and BERT-base (batch 8, fp16, CUDA graphs), and with MODELS naming it
# resnet50-eager (the same ResNet-50 as plain eager PyTorch: launch-bound production, at EAGER_LOADS), to
# Poisson arrivals at 30% and 70% load (load =
# rate x solo service time, CPU side included), REPS times each; per configuration it prints p50/p99
# against alone (median of the repetitions, with min-max), the trainers' throughput against solo and
# against the idle share production leaves (1 - its GPU-busy fraction alone, from CUDA events around each
# request's GPU work: the most a trainer can have where one context runs at a time), and whether
# production's outputs and the trainer's first losses are bit-identical to their runs alone.
# TRAINER picks the opportunistic job: resnet50 (batch 128, 224 px, fp16 autocast; the default) or
# resnet50-160 (batch 64, 160 px, fp32: shorter kernels). Run both before comparing modes: the ranking
# depends on the trainer's kernel lengths.
#
# REPS=3 over more than three configurations is a long run: start it detached from the terminal and
# follow its log until "== results" is there; bench.log and logs.tgz (the raw results) land in OUT:
#   setsid nohup make bench-qos REPS=3 CONFIGS="..." OUT=/tmp/q >/tmp/q.out 2>&1 < /dev/null & echo started
#   tail -f /tmp/q/bench.log
# or split CONFIGS over several runs (each repeats alone and solo, the baselines its ratios are against).
#
# No Go on the GPU machine: build the standalone scheduler elsewhere and carry it along:
#   go build -o shim/build/gpushare-scheduler ./cmd/gpushare-scheduler
# The GPU is shared: compute mode and the time-slice policy are never changed, MPS runs with its own pipe
# and log directories under a temporary folder and is quit before the script ends, and no managed memory
# is used. CONFIGS picks configurations (alone and solo always run: every ratio is against them).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
HERE=$ROOT/test/gpu/qos
OUT=${OUT:-/tmp/gpu-qos-out}
BUILD=$ROOT/shim/build
REPS=${REPS:-3}
SECONDS_PER_PHASE=${SECONDS_PER_PHASE:-6}
CONFIGS=${CONFIGS:-timeslice mps mps-prio gs-mps gs-shim gs-oversub}
QOS_MPS_THREADS=${QOS_MPS_THREADS:-50}
QUANTUM=${QUANTUM:-2s}
PACE=${PACE:-3}
QUEUE_US=${QUEUE_US:-500}  # the trainer's queue in GPU time (--opportunistic-queue-time; 0: PACE launches alone)
SETTLE_US=${SETTLE_US:-100} # production's release on completion (--settle-floor; 0: the idle window alone)
IDLE_US=${IDLE_US:-} # production's own idle window, in us; only one shorter than the scheduler's 1 ms holds
MODELS=${MODELS:-resnet50 bert} # a subset for a focused sweep
LOADS=${LOADS:-0.3 0.7}
EAGER_LOADS=${EAGER_LOADS:-0.7} # resnet50-eager's loads: launch-bound production is measured at ~70 % load
TRAINER=${TRAINER:-resnet50}
case $TRAINER in
resnet50) TRAIN_ARGS="" ;;
resnet50-160) TRAIN_ARGS="--batch 64 --size 160 --fp32" ;;
*) echo "unknown TRAINER $TRAINER (resnet50 or resnet50-160)"; exit 1 ;;
esac
mkdir -p "$OUT"
T=$(mktemp -d /tmp/gs-qos.XXXXXX)
exec > >(tee "$OUT/bench.log") 2>&1
MPS_PIPE=$T/mps-pipe MPS_LOG=$T/mps-log SCHED_PID=""
cleanup() {
	pkill -TERM -f "$HERE/train.py" 2>/dev/null
	pkill -TERM -f "$HERE/serve.py" 2>/dev/null
	[ -n "$SCHED_PID" ] && kill -INT "$SCHED_PID" 2>/dev/null && wait "$SCHED_PID" 2>/dev/null
	if [ -e "$MPS_PIPE/control" ]; then echo quit | CUDA_MPS_PIPE_DIRECTORY=$MPS_PIPE nvidia-cuda-mps-control; sleep 1; fi
	tar czf "$OUT/logs.tgz" -C "$T" . 2>/dev/null
	rm -rf "$T"
}
trap cleanup EXIT

echo "# bench-qos $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i 0)"
echo "# command: make bench-qos REPS=$REPS SECONDS_PER_PHASE=$SECONDS_PER_PHASE CONFIGS=\"$CONFIGS\" QOS_MPS_THREADS=$QOS_MPS_THREADS QUANTUM=$QUANTUM PACE=$PACE QUEUE_US=$QUEUE_US SETTLE_US=$SETTLE_US IDLE_US=$IDLE_US MODELS=\"$MODELS\" LOADS=\"$LOADS\" EAGER_LOADS=\"$EAGER_LOADS\" TRAINER=$TRAINER"
PHASES=""
for rep in $(seq 0 $((REPS - 1))); do
	for model in $MODELS; do
		loads=$LOADS
		[ "$model" = resnet50-eager ] && loads=$EAGER_LOADS
		for load in $loads; do PHASES="$PHASES${PHASES:+,}$model:$load:$rep"; done
	done
done
# The run's length: every configuration with production serves its phases (each SECONDS_PER_PHASE, 0.3 s
# apart) after ~20 s of start-up (models built and warmed, trainers at their first steps); alone and solo
# always run; a trainer alone runs 3 phases' time after ~20 s; calibration ~20 s.
n_phases=$(tr , '\n' <<<"$PHASES" | wc -l)
n_prod=1 n_solo=1
for c in $CONFIGS; do case $c in gs-solo*) n_solo=$((n_solo + 1)) ;; *) n_prod=$((n_prod + 1)) ;; esac; done
est=$((20 + n_prod * (n_phases * (SECONDS_PER_PHASE * 10 + 3) / 10 + 20) + n_solo * (3 * SECONDS_PER_PHASE + 20)))
echo "# estimate: $n_phases phases of ${SECONDS_PER_PHASE} s in each of $n_prod configurations with production, $n_solo with a trainer alone: about $((est / 60)) min $((est % 60)) s"
python3 -c 'import torch; print("# torch", torch.__version__, "cuda", torch.version.cuda)'
nvidia-smi --query-gpu=compute_mode,memory.used --format=csv -i 0
make -s -C "$ROOT/shim" all || exit 1
[ -x "$BUILD/gpushare-scheduler" ] || { echo "missing $BUILD/gpushare-scheduler (go build -o shim/build/gpushare-scheduler ./cmd/gpushare-scheduler)"; exit 1; }
UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0 | tr -d ' ')
export CUDA_VISIBLE_DEVICES=0


# run_config NAME TRAINERS SERVER_ENV TRAINER_ENV [TRAIN_ARGS]: the trainers start first; production builds and
# warms its models meanwhile and starts its phases once every trainer has run a few steps.
run_config() {
	local name=$1 trainers=$2 senv=$3 tenv=$4 targs=${5:-}
	local d=$T/$name
	mkdir -p "$d"
	local pids=()
	for i in $(seq 1 "$trainers"); do
		env $tenv timeout 900 python3 "$HERE/train.py" --out "$d/train$i.json" --ready "$d/train$i.ready" $TRAIN_ARGS $targs \
			>"$d/train$i.log" 2>&1 &
		pids+=($!)
	done
	if [ "$name" = solo ] || [[ $name == gs-solo* ]]; then
		for _ in $(seq 600); do [ -e "$d/train1.ready" ] && break; sleep 0.1; done
		sleep $((SECONDS_PER_PHASE * 3))
	else
		env $senv timeout 900 python3 "$HERE/serve.py" --models "$SERVE_MODELS" --service "$SERVICE" --phases "$PHASES" \
			--seconds "$SECONDS_PER_PHASE" --ready "$d/serve.ready" >"$d/serve.json" 2>"$d/serve.log" &
		local spid=$!
		for _ in $(seq 1800); do
			local n=0
			for i in $(seq 1 "$trainers"); do [ -e "$d/train$i.ready" ] && n=$((n + 1)); done
			[ -e "$d/serve.ready" ] && [ "$n" -eq "$trainers" ] && break
			sleep 0.1
		done
		touch "$d/serve.ready.go"
		wait $spid || echo "!! $name: production exited with $?; $(tail -3 "$d/serve.log")"
	fi
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
	for p in "${pids[@]}"; do wait "$p" || echo "!! $name: a trainer exited with $?; $(tail -3 "$d/train1.log")"; done
	echo "-- $name done"
}

start_mps() {
	mkdir -p "$MPS_PIPE" "$MPS_LOG"
	CUDA_MPS_PIPE_DIRECTORY=$MPS_PIPE CUDA_MPS_LOG_DIRECTORY=$MPS_LOG nvidia-cuda-mps-control -d
}
stop_mps() {
	echo quit | CUDA_MPS_PIPE_DIRECTORY=$MPS_PIPE nvidia-cuda-mps-control
	for _ in $(seq 100); do pgrep -f nvidia-cuda-mps-server >/dev/null || break; sleep 0.1; done
	rm -rf "$MPS_PIPE"
}
start_sched() { # start_sched BUDGET_BYTES [FLAG...]: the standalone scheduler with the product's terms (or FLAGs')
	SOCK_DIR=$T/sock-$1
	mkdir -p "$SOCK_DIR"
	"$BUILD/gpushare-scheduler" --socket-dir "$SOCK_DIR" --gpu "$UUID:$QUANTUM::$1:Auto" --opportunistic-queue "$PACE" \
		--opportunistic-queue-time "${QUEUE_US}us" --settle-floor "${SETTLE_US}us" "${@:2}" -v 1 2>"$T/scheduler-$1.log" &
	SCHED_PID=$!
	for _ in $(seq 100); do [ -S "$SOCK_DIR/$UUID.sock" ] && break; sleep 0.05; done
	# As the agent sets it up on a GPU with sharing.qos: the scheduler tells production its 1 ms idle
	# window (IDLE) while a trainer is connected, and the trainers keep the shim's default. Production is
	# named by GPUSHARE_PRIORITY here, where the standalone scheduler has no pods.
	SHIM="LD_PRELOAD=$BUILD/libgpushare.so GPUSHARE_SOCKET=$SOCK_DIR/$UUID.sock GPUSHARE_GPU_UUID=$UUID GPUSHARE_OVERSUB=1"
	PROD="$SHIM GPUSHARE_PRIORITY=high GPUSHARE_LOG_LEVEL=info${IDLE_US:+ GPUSHARE_IDLE_US=$IDLE_US}"
}
stop_sched() {
	kill -INT "$SCHED_PID"
	wait "$SCHED_PID"
	SCHED_PID=""
	grep -E "Serving GPU lock|^client |^gpu |preempt" "$T/scheduler-$1.log" | head -20 | sed "s/^/  scheduler: /"
}

SERVE_MODELS=$(tr ' ' , <<<"$MODELS")
echo "== calibrate (production alone, back to back)"
python3 "$HERE/serve.py" --models "$SERVE_MODELS" --calibrate >"$T/calibrate.json" 2>"$T/calibrate.log" || { cat "$T/calibrate.log"; exit 1; }
cat "$T/calibrate.json"
SERVICE=$(python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))["calibrate"]; print(",".join(f"{k}={v:.3f}" for k,v in c.items()))' "$T/calibrate.json")
echo "== alone"; run_config alone 0 "" ""
echo "== solo"; run_config solo 1 "" ""
MPS_ENV="CUDA_MPS_PIPE_DIRECTORY=$MPS_PIPE CUDA_MPS_LOG_DIRECTORY=$MPS_LOG"
for c in $CONFIGS; do
	echo "== $c"
	case $c in
	timeslice) run_config timeslice 1 "" "" ;;
	mps) start_mps; run_config mps 1 "$MPS_ENV" "$MPS_ENV"; stop_mps ;;
	mps-alone) start_mps; run_config mps-alone 0 "$MPS_ENV" ""; stop_mps ;;
	mps-prio) start_mps; run_config mps-prio 1 "$MPS_ENV" "$MPS_ENV CUDA_MPS_CLIENT_PRIORITY=1"; stop_mps ;;
	gs-mps | gs-mps-t*)
		threads=$QOS_MPS_THREADS
		[ "$c" != gs-mps ] && threads=${c#gs-mps-t}
		start_mps
		run_config "$c" 1 "$MPS_ENV" "$MPS_ENV CUDA_MPS_CLIENT_PRIORITY=1 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$threads"
		stop_mps ;;
	gs-alone)
		start_sched $((60 << 30))
		run_config gs-alone 0 "$PROD" ""
		stop_sched $((60 << 30)) ;;
	gs-shim-window)
		start_sched $((60 << 30)) --settle-floor 0 --opportunistic-queue-time 0
		run_config gs-shim-window 1 "$PROD" "$SHIM"
		stop_sched $((60 << 30)) ;;
	gs-shim | gs-shim-[pifqs]* | gs-mps-shim | gs-mps-shim-[pifqst]*)
		keep="$PACE $QUEUE_US $SETTLE_US $IDLE_US" # IDLE_US last: it may be empty
		full="" threads="" senv="" tenv=""
		for part in $(tr - ' ' <<<"${c#gs-*shim}"); do
			case $part in
			p*) PACE=${part#p} ;; i*) IDLE_US=${part#i} ;; f*) full=" GPUSHARE_PACE_FULL_US=${part#f}" ;;
			q*) QUEUE_US=${part#q} ;; s*) SETTLE_US=${part#s} ;;
			t*) threads=" CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=${part#t}" ;;
			esac
		done
		if [[ $c == gs-mps-shim* ]]; then
			start_mps
			senv="$MPS_ENV " tenv="$MPS_ENV CUDA_MPS_CLIENT_PRIORITY=1$threads "
		fi
		start_sched $((60 << 30))
		run_config "$c" 1 "$senv$PROD" "$tenv$SHIM$full"
		stop_sched $((60 << 30))
		[[ $c == gs-mps-shim* ]] && stop_mps
		read -r PACE QUEUE_US SETTLE_US IDLE_US <<<"$keep" ;;
	gs-shim-base)
		# gs-shim with another build of the shim (BASE_SHIM: its libgpushare.so), beside gs-shim in the same
		# run: what a change to the shim costs, against the same scheduler, models and baselines.
		[ -f "${BASE_SHIM:-}" ] || { echo "gs-shim-base needs BASE_SHIM=<path of the other build's libgpushare.so>"; continue; }
		start_sched $((60 << 30))
		run_config gs-shim-base 1 "${PROD/$BUILD\/libgpushare.so/$BASE_SHIM}" "${SHIM/$BUILD\/libgpushare.so/$BASE_SHIM}"
		stop_sched $((60 << 30)) ;;
	gs-solo)
		start_sched $((60 << 30))
		run_config "$c" 1 "" "$SHIM GPUSHARE_PACE_OVERRIDE=$PACE GPUSHARE_PACE_TIME_OVERRIDE_US=$QUEUE_US GPUSHARE_LOG_LEVEL=info"
		stop_sched $((60 << 30)) ;;
	gs-solo-count | gs-solo-f*)
		full=""
		[[ $c == gs-solo-f* ]] && full="GPUSHARE_PACE_FULL_US=${c#gs-solo-f}"
		start_sched $((60 << 30))
		run_config "$c" 1 "" "$SHIM GPUSHARE_PACE_OVERRIDE=$PACE GPUSHARE_PACE_TIME_OVERRIDE_US=0 GPUSHARE_LOG_LEVEL=info $full"
		stop_sched $((60 << 30)) ;;
	gs-oversub)
		# Production's memory plus one trainer's fit; a second trainer does not: they swap between themselves.
		B=$(python3 - "$T" <<'PY'
import json, sys
t = json.load(open(sys.argv[1] + "/solo/train1.json"))["memory_reserved"]
print(int(2 * 1024**3 + 1.5 * t))
PY
)
		echo "   budget $((B >> 20)) MiB (2 GiB for production + 1.5 trainers)"
		start_sched "$B"
		run_config gs-oversub 2 "$PROD" "$SHIM"
		stop_sched "$B" ;;
	*) echo "unknown configuration $c" ;;
	esac
done
echo "== results"
python3 "$HERE/report.py" "$T" alone solo $CONFIGS
