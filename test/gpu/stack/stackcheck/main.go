// Command stackcheck runs gpusharing's whole loop on a real GPU: a policy applied with kubectl becomes
// sharing on the GPU and honest status. It starts etcd and kube-apiserver (envtest, loopback), the
// manager and the agent as separate processes from the binaries `make build` produced, and plays the
// kubelet with test/fakekubelet: the agent's device plugin registers with it, and every container is
// started with exactly the env and mounts Allocate returned (in a mount namespace of its own). Each
// scenario prints PASS or FAIL lines, checked from the API and from the GPU.
//
// Run it through test/gpu/stack/run.sh on the GPU machine. House rules there: MIG mode, compute mode and
// the time-slice policy are never changed (the agent gets a refusing nvidia-smi, and no policy asks for
// MIG or TimeSlicing), the GPU is never reset, and every MPS daemon lives under the work directory and is
// quit before the program ends.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

type options struct {
	repo     string // a checkout: config/crd/bases, test/gpu/*.py
	assets   string // etcd, kube-apiserver, kubectl
	bin      string // manager, agent
	shimLib  string // libgpushare.so, built on the GPU machine
	work     string // every host path the agent and the containers use
	out      string // logs and results
	python   string
	gpuIndex int
	timeout  time.Duration
	// scenarios are the scenarios to run (scenarioNames), in their fixed order; empty: all.
	scenarios map[string]bool
}

func main() {
	var o options
	flag.StringVar(&o.repo, "repo", ".", "repository checkout (CRDs, workloads)")
	flag.StringVar(&o.assets, "assets", "bin", "directory holding etcd, kube-apiserver and kubectl")
	flag.StringVar(&o.bin, "bin", "bin", "directory holding the manager and agent binaries")
	flag.StringVar(&o.shimLib, "shim-library", "shim/build/libgpushare.so", "libgpushare.so")
	flag.StringVar(&o.work, "work", "", "work directory (default: a new temporary one)")
	flag.StringVar(&o.out, "out", "", "where logs go (default: <work>/out)")
	flag.StringVar(&o.python, "python", "python3", "python with PyTorch")
	flag.IntVar(&o.gpuIndex, "gpu", 0, "index of the GPU to use")
	flag.DurationVar(&o.timeout, "timeout", 9*time.Minute, "the whole run's limit")
	scenarios := flag.String("scenarios", "all", "comma-separated scenarios to run, each after the agent is up: "+strings.Join(scenarioNames, ", ")+" (all: every one, in that order, but rightsizing, which runs only when named)")
	flag.Parse()
	var err error
	if o.scenarios, err = parseScenarios(*scenarios); err != nil {
		fmt.Println("FAIL --scenarios:", err)
		os.Exit(2)
	}

	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	r := &report{}
	s, err := newStack(ctx, o, r)
	if err != nil {
		fmt.Println("FAIL setup:", err)
		if s != nil {
			s.teardown()
		}
		os.Exit(1)
	}
	s.run(ctx)
	s.teardown()
	r.summary()
	if r.failed > 0 {
		os.Exit(1)
	}
}
