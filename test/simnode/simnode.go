// Package simnode runs the real node agent for a simulated GPU node: go-nvml's mock DGX A100 or H100
// server (extended by agent/gpu/nvmlmock, with the real GPUs' MIG geometry) and fake nvidia-smi and
// nvidia-cuda-mps-control. The demo and the deployment tests use it, so both exercise exactly the agent
// that cmd/agent runs.
package simnode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/gpusharing/gpusharing/agent/app"
	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/test/fakebin"
)

// Node is one simulated GPU node.
type Node struct {
	// Name is the Node's and its GPUNode's name.
	Name string
	// Model is "A100" (DGX A100, A100-SXM4-40GB as NVIDIA documents it) or "H100" (DGX H100, with the MIG
	// profiles a real H100 80GB HBM3 reported).
	Model string
	// GPUs is how many of the server's eight GPUs the node has.
	GPUs int
	// Labels are the Node's labels, which policies select on.
	Labels map[string]string
	// Seq makes the node's GPU UUIDs distinct from other simulated nodes'.
	Seq int
	// ResourceSlices publishes the node's shares as DRA ResourceSlices (no kubelet plugin: nothing runs
	// a kubelet here).
	ResourceSlices bool
	// DRAPlugin also serves the agent's DRA kubelet plugin, and a Kubelet (kubelet.go) prepares the
	// claims of the pods bound to the node through it and finishes their deletion.
	DRAPlugin bool
	// PodUsage simulates the use of the pods the Kubelet runs (podusage.go) and runs the agent's
	// per-pod accounting over it; it needs DRAPlugin.
	PodUsage bool
}

// podUsageInterval is how often a PodUsage node's mock GPUs look at its processes and its agent reads them.
const podUsageInterval = time.Second

// CreateNode registers the Node object. Nothing runs a kubelet: the controller and the agent only read
// its name and labels.
func CreateNode(ctx context.Context, c client.Client, n Node) error {
	return c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: n.Labels}})
}

// Start runs the agent for n under cfg's identity until ctx ends, with its host directories under dir.
// A manager failure is sent to errs.
func Start(ctx context.Context, cfg *rest.Config, scheme *k8sruntime.Scheme, n Node, dir string, errs chan<- error) error {
	dir = filepath.Join(dir, n.Name)
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
	server := NewServer(n)
	var plugin *dra.PluginConfig
	if n.DRAPlugin {
		plugin = &dra.PluginConfig{PluginDir: filepath.Join(dir, "p"), RegistryDir: filepath.Join(dir, "r"), CDIDir: filepath.Join(dir, "cdi")}
	}
	procRoot := ""
	var accounting *app.AccountingOptions
	if n.PodUsage && plugin != nil {
		procRoot = filepath.Join(dir, "proc")
		if err := os.MkdirAll(procRoot, 0o755); err != nil {
			return err
		}
		accounting = &app.AccountingOptions{Interval: podUsageInterval}
		go server.WatchHostProcesses(ctx, procRoot, podUsageInterval, nil)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:  scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
		Cache:   app.CacheOptions(n.Name),
	})
	if err != nil {
		return fmt.Errorf("creating the agent manager for %s: %w", n.Name, err)
	}
	err = app.Setup(mgr, app.Options{
		NodeName: n.Name,
		GPU:      gpu.NewNVML(server),
		MPSRoot:  filepath.Join(dir, "mps"),
		// A short name: <root>/<gpu-uuid>/gpushare.sock must fit a Unix socket path (107 bytes).
		SchedulerRoot:      filepath.Join(dir, "s"),
		StateDir:           filepath.Join(dir, "state"),
		MPSControl:         mpsControl.Path,
		NvidiaSMI:          smi.Path,
		Resync:             10 * time.Second,
		SkipNameValidation: true,
		Health:             &app.HealthOptions{},
		ResourceSlices:     n.ResourceSlices || n.DRAPlugin,
		DRAPlugin:          plugin,
		ProcRoot:           procRoot,
		Accounting:         accounting,
	})
	if err != nil {
		return err
	}
	go func() {
		if err := mgr.Start(ctx); err != nil {
			errs <- fmt.Errorf("agent on %s: %w", n.Name, err)
		}
	}()
	if plugin != nil {
		c, err := client.New(cfg, client.Options{Scheme: scheme})
		if err != nil {
			return err
		}
		k := &Kubelet{Node: n.Name, Client: c, PluginDir: plugin.PluginDir, ProcRoot: procRoot, CDIDir: plugin.CDIDir}
		go func() { _ = k.Run(ctx) }()
	}
	return nil
}

// NewServer is the node's simulated GPU server (nvmlmock.NewNode). Node values are the demo's and the
// tests' own, so a bad one is a defect in them.
func NewServer(n Node) *nvmlmock.Server {
	server, err := nvmlmock.NewNode(n.Model, n.GPUs, n.Seq)
	if err != nil {
		panic(err)
	}
	return server
}

// StopDaemons ends the stand-in MPS daemons the simulated nodes under dir started.
func StopDaemons(dir string) { fakebin.KillDaemons(dir) }
