package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/gpusharing/gpusharing/agent/app"
	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/test/fakebin"
)

// simNode is one simulated GPU node: a mock DGX with some of its GPUs, and the labels the sample
// policies select on.
type simNode struct {
	name   string
	model  string
	gpus   int
	labels map[string]string
}

// simNodes cover every sample: two inference nodes (MPS, with MIG on GPUs 0-1 by the higher-priority
// mixed-mig policy, rolled out one node at a time), and one node each for notebooks (time-slicing),
// training (exclusive) and batch (time-slicing with oversubscription).
var simNodes = []simNode{
	{name: "dgx-h100-a", model: "H100", gpus: 8, labels: map[string]string{"pool": "inference"}},
	{name: "dgx-h100-b", model: "H100", gpus: 8, labels: map[string]string{"pool": "inference"}},
	{name: "dgx-a100-c", model: "A100", gpus: 8, labels: map[string]string{"pool": "notebooks"}},
	{name: "dgx-a100-d", model: "A100", gpus: 4, labels: map[string]string{"pool": "training"}},
	{name: "dgx-h100-e", model: "H100", gpus: 4, labels: map[string]string{"pool": "batch"}},
}

// runNode registers the Node and starts the real agent for it over a mock DGX.
func (c *cluster) runNode(ctx context.Context, n simNode, errs chan<- error) error {
	if err := c.createNode(ctx, n); err != nil {
		return fmt.Errorf("creating node %s: %w", n.name, err)
	}
	dir := filepath.Join(c.dir, n.name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	mpsControl, err := fakebin.NewMPSControl(dir)
	if err != nil {
		return err
	}
	smi, err := fakebin.NewNvidiaSMI(dir, false)
	if err != nil {
		return err
	}
	server := nvmlmock.NewH100(n.gpus)
	if n.model == "A100" {
		server = nvmlmock.NewA100(n.gpus)
	}
	// The mocks number every server's GPUs alike; real UUIDs are unique across the fleet.
	for i, g := range server.GPUs {
		g.Device.UUID = fmt.Sprintf("GPU-%08x-%04x-4000-8000-000000000000", nodeSeq(n.name), i)
	}
	mgr, err := ctrl.NewManager(c.env.Config, ctrl.Options{
		Scheme:  c.env.Scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
		Cache:   app.CacheOptions(n.name),
	})
	if err != nil {
		return fmt.Errorf("creating the agent manager for %s: %w", n.name, err)
	}
	err = app.Setup(mgr, app.Options{
		NodeName:           n.name,
		GPU:                gpu.NewNVML(server),
		MPSRoot:            filepath.Join(dir, "mps"),
		StateDir:           filepath.Join(dir, "state"),
		MPSControl:         mpsControl.Path,
		NvidiaSMI:          smi.Path,
		Resync:             10 * time.Second,
		SkipNameValidation: true,
	})
	if err != nil {
		return err
	}
	go func() {
		if err := mgr.Start(ctx); err != nil {
			errs <- fmt.Errorf("agent on %s: %w", n.name, err)
		}
	}()
	return nil
}

// nodeSeq gives each simulated node a distinct number for its GPU UUIDs.
func nodeSeq(name string) int {
	for i, n := range simNodes {
		if n.name == name {
			return i + 1
		}
	}
	return 0
}

// stopNodeDaemons ends the stand-in MPS daemons the simulated nodes started.
func stopNodeDaemons(dir string) { fakebin.KillDaemons(dir) }
