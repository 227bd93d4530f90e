// Command gpushare-scheduler runs the per-GPU lock server for libgpushare.so
// on its own, outside the node agent: for the GPU benchmarks and for trying
// the shim on a machine without Kubernetes.
//
//	gpushare-scheduler --socket-dir /run/gpushare --gpu GPU-1234:200ms --gpu GPU-5678:1s:500ms:16Gi:Auto
//
// Each --gpu is uuid:quantum[:grace[:budget[:mode]]]; the socket is
// <socket-dir>/<uuid>.sock. budget (bytes, or with Ki/Mi/Gi) turns on memory
// accounting for oversubscription (clients run with GPUSHARE_OVERSUB=1);
// mode is the anti-thrashing policy, Auto (default), Always or Off. An empty
// grace keeps the default.
// With no pods to ask, a client's class is what its hello asks: a process with
// GPUSHARE_PRIORITY=high is production and preempts the others, which are
// opportunistic and paced to --opportunistic-queue launches while it is
// connected.
// It lets the clients' environments loosen their pacing and waits (GPUSHARE_PACE_OVERRIDE and its
// siblings, for measuring; --env-overrides=false as the agent does).
// On SIGINT/SIGTERM it prints each client's state and the counters, then exits.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/scheduler"
)

type gpuFlags []string

func (g *gpuFlags) String() string     { return strings.Join(*g, ",") }
func (g *gpuFlags) Set(v string) error { *g = append(*g, v); return nil }

func parseGPU(dir, v string) (scheduler.GPUConfig, error) {
	parts := strings.Split(v, ":")
	if len(parts) < 2 || len(parts) > 5 || parts[0] == "" {
		return scheduler.GPUConfig{}, fmt.Errorf("--gpu %q: want uuid:quantum[:grace[:budget[:mode]]]", v)
	}
	q, err := time.ParseDuration(parts[1])
	if err != nil {
		return scheduler.GPUConfig{}, fmt.Errorf("--gpu %q quantum: %w", v, err)
	}
	cfg := scheduler.GPUConfig{UUID: parts[0], SocketPath: filepath.Join(dir, parts[0]+".sock"), Quantum: q}
	if len(parts) >= 3 && parts[2] != "" {
		if cfg.Grace, err = time.ParseDuration(parts[2]); err != nil {
			return scheduler.GPUConfig{}, fmt.Errorf("--gpu %q grace: %w", v, err)
		}
	}
	if len(parts) >= 4 {
		if cfg.Budget, err = parseBytes(parts[3]); err != nil {
			return scheduler.GPUConfig{}, fmt.Errorf("--gpu %q budget: %w", v, err)
		}
	}
	if len(parts) == 5 {
		if cfg.Mode, err = scheduler.ParseMode(parts[4]); err != nil {
			return scheduler.GPUConfig{}, fmt.Errorf("--gpu %q: %w", v, err)
		}
	}
	return cfg, nil
}

// parseBytes reads 123, 64Ki, 512Mi, 16Gi.
func parseBytes(s string) (uint64, error) {
	mult := uint64(1)
	for suf, m := range map[string]uint64{"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30} {
		if strings.HasSuffix(s, suf) {
			s, mult = strings.TrimSuffix(s, suf), m
			break
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, err
	}
	return n * mult, nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "gpushare-scheduler:", err)
		os.Exit(1)
	}
}

// schedulerFlags are the scheduler's flags, parsed once in run.
type schedulerFlags struct {
	gpus                              gpuFlags
	dir, metricsAddr                  *string
	verbosity                         *int
	rebuild, oppQueueTime, settle     *time.Duration
	serial, envOverrides, gangs, nvml *bool
	oppQueue                          *uint
	claimMem, ctxReserve              *uint64
}

// flagSet binds every flag of the scheduler: the flag set run parses and docs/reference lists.
func flagSet() (*flag.FlagSet, *schedulerFlags) {
	fs := flag.NewFlagSet("gpushare-scheduler", flag.ExitOnError)
	f := &schedulerFlags{}
	f.dir = fs.String("socket-dir", "/run/gpushare", "directory for the per-GPU sockets")
	f.metricsAddr = fs.String("metrics-addr", "", "serve Prometheus metrics on this address (empty: off)")
	f.verbosity = fs.Int("v", 0, "log verbosity (1: client connects and disconnects)")
	f.rebuild = fs.Duration("rebuild-window", scheduler.DefaultRebuildWindow,
		"after a restart (a socket or restart mark left by a previous run), grant nothing this long while clients re-announce their memory")
	fs.Var(&f.gpus, "gpu", "uuid:quantum[:grace[:budget[:mode]]], repeatable, at least one: a GPU served on <socket-dir>/<uuid>.sock; "+
		"budget (bytes, or with Ki/Mi/Gi) turns on memory accounting for oversubscription (clients run with GPUSHARE_OVERSUB=1); "+
		"mode is the anti-thrashing policy, Auto (default), Always or Off; an empty grace keeps the default")
	f.serial = fs.Bool("serial-handoffs", false,
		"hand off in series, the newcomer's copy-in only after the leaver's copy-out (slower: to measure each direction of a swap alone)")
	f.oppQueue = fs.Uint("opportunistic-queue", scheduler.DefaultOpportunisticQueue,
		"launches an opportunistic client may keep outstanding on the GPU while a production client is busy: waits for or holds the GPU, or did within 1 s (sent to shims of protocol version 4 and later; those of version 7 and later take --opportunistic-queue-time instead unless it is 0)")
	f.oppQueueTime = fs.Duration("opportunistic-queue-time", scheduler.DefaultOpportunisticQueueTime,
		"GPU time an opportunistic client may keep outstanding while a production client is busy (waits for or holds the GPU, or did within 1 s), by the shim's estimate of each launch's run time (shims of protocol version 7 and later; 0: the bound in launches, --opportunistic-queue, alone)")
	f.settle = fs.Duration("settle-floor", scheduler.DefaultSettleFloor,
		"while an opportunistic client is busy, a production client releases the GPU once its submitted work completed and this long passed without a GPU call (shims of protocol version 7 and later; 0: off, the 1 ms idle window alone)")
	f.claimMem = fs.Uint64("claim-memory", 0,
		"put every client of a GPU in one claim ledger of this many bytes, contexts included (0: none; the agent names each client's claim)")
	f.ctxReserve = fs.Uint64("context-reserve", scheduler.DefaultContextReserve,
		"bytes charged to a claim ledger per process for its CUDA context until NVML has a figure for it")
	f.nvml = fs.Bool("nvml", false,
		"read each client's device memory through NVML: a claim ledger charges each process's context as NVML counts it, and memory reports are checked against NVML's figure, context included (off, or no NVML: the context reserve, reports as they come)")
	f.envOverrides = fs.Bool("env-overrides", true,
		"let the clients' environments loosen their pacing and waits (GPUSHARE_PACE_OVERRIDE, GPUSHARE_PACE_FULL_US, GPUSHARE_PACE_WAIT_MAX_MS, GPUSHARE_WAIT_TIMEOUT_MS, GPUSHARE_MEMREPLY_TIMEOUT_MS, GPUSHARE_CONNECT_TIMEOUT_MS, GPUSHARE_RECONNECT_MAX_MS: for measuring; the agent never allows it)")
	f.gangs = fs.Bool("gangs", true,
		"clients of one session (a job started under setsid) on several GPUs take their turns on all of them at once (a gang); false: each GPU alone")
	return fs, f
}

// offWhenZero is a duration flag in GPUConfig's terms, where 0 is the default and a negative value off.
func offWhenZero(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}

func run() error {
	fs, f := flagSet()
	_ = fs.Parse(os.Args[1:])
	if *f.oppQueue == 0 || *f.oppQueue > math.MaxUint32 {
		// 0 would read as "unbounded", which PACE 0 means; the configuration takes it as the default.
		return fmt.Errorf("--opportunistic-queue %d: want 1 to %d", *f.oppQueue, uint32(math.MaxUint32))
	}
	if len(f.gpus) == 0 {
		return errors.New("at least one --gpu is required")
	}
	if err := os.MkdirAll(*f.dir, 0o755); err != nil {
		return err
	}
	var cfgs []scheduler.GPUConfig
	for _, v := range f.gpus {
		cfg, err := parseGPU(*f.dir, v)
		if err != nil {
			return err
		}
		cfg.SerialHandoffs = *f.serial
		cfg.OpportunisticQueue = uint32(*f.oppQueue)
		cfg.OpportunisticQueueTime, cfg.SettleFloor = offWhenZero(*f.oppQueueTime), offWhenZero(*f.settle)
		cfgs = append(cfgs, cfg)
	}
	log := funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) },
		funcr.Options{Verbosity: *f.verbosity, LogTimestamp: true})
	reg := prometheus.NewRegistry()
	if *f.rebuild <= 0 {
		*f.rebuild = -1 // Options: negative is none
	}
	guards := scheduler.Guards{ContextReserve: *f.ctxReserve}
	if *f.nvml {
		lib := nvml.New()
		if r := lib.Init(); r == nvml.SUCCESS {
			defer func() { _ = lib.Shutdown() }()
			guards.ProcessMemory = scheduler.ProcessMemoryFrom(gpu.NewNVML(lib))
		} else {
			log.Info("No NVML: claim ledgers charge the context reserve per process", "reason", r.Error())
		}
	}
	if !*f.gangs {
		guards.GangKey = func(int32) string { return "" }
	}
	if *f.claimMem > 0 {
		guards.ClaimOf = func(gpu string, _ int32) (scheduler.Claim, bool) {
			return scheduler.Claim{Key: "claim", Memory: *f.claimMem}, true
		}
	}
	s, err := scheduler.New(scheduler.Options{GPUs: cfgs, Registerer: reg, RebuildWindow: *f.rebuild, Guards: guards,
		EnvOverrides: *f.envOverrides})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx = logr.NewContext(ctx, log)
	if *f.metricsAddr != "" {
		srv := &http.Server{Addr: *f.metricsAddr, Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.ListenAndServe() }()
		defer func() { _ = srv.Close() }()
	}
	if err := s.Listen(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	for _, c := range s.Snapshot() {
		fmt.Fprintf(os.Stderr, "client gpu=%s id=%d pid=%d priority=%s holding=%t waits=%d wait=%s hold=%s grants=%d revocations=%d preemptions=%d launch_bound=%d pacing=%s gang=%q\n",
			c.GPU, c.ID, c.PID, c.Class, c.Holding, c.Waits, c.WaitTime, c.HoldTime, c.Grants, c.Revocations, c.Preemptions,
			c.LaunchBound, c.PacingState, c.Gang)
	}
	for _, g := range s.GPUs() {
		if g.Budget > 0 {
			fmt.Fprintf(os.Stderr, "gpu %s budget=%d mode=%s reserved=%d peak_reserved=%d\n", g.GPU, g.Budget, g.Mode,
				g.ReservedBytes, g.PeakReservedBytes)
		}
	}
	s.Close()
	return printCounters(reg)
}

func printCounters(reg *prometheus.Registry) error {
	mfs, err := reg.Gather()
	if err != nil {
		return err
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			series := mf.GetName() + "{" + strings.Join(labels, ",") + "}"
			switch {
			case m.GetCounter() != nil:
				fmt.Fprintf(os.Stderr, "%s %g\n", series, m.GetCounter().GetValue())
			case m.GetHistogram() != nil:
				h := m.GetHistogram()
				fmt.Fprintf(os.Stderr, "%s count=%d sum=%gs\n", series, h.GetSampleCount(), h.GetSampleSum())
			}
		}
	}
	return nil
}
