package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/runner"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/setup"
	"github.com/gpusharing/gpusharing/test/simnode"
	"github.com/gpusharing/gpusharing/test/testenv"
)

// cluster is the embedded control plane and what the demo started on it.
type cluster struct {
	env        *testenv.Env
	dir        string
	kubeconfig string
	kubectl    string
	// scheduler is the kube-scheduler the sized claims need (sized.go), once started.
	scheduler *testenv.Scheduler
	// claimController is kube-controller-manager with its ResourceClaim controller alone.
	claimController *testenv.Component
	// appControllers is kube-controller-manager with the Deployment, ReplicaSet and garbage collector
	// controllers, for the right-sizing part (rightsizing.go), once started.
	appControllers *testenv.Component
}

func startCluster() (*cluster, error) {
	env, err := testenv.Start()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "gpusharing-demo-")
	if err != nil {
		_ = env.Stop()
		return nil, err
	}
	c := &cluster{env: env, dir: dir, kubectl: filepath.Join(env.BinDir, "kubectl")}
	if _, err := os.Stat(c.kubectl); err != nil {
		c.kubectl = "kubectl"
	}
	if c.kubeconfig, err = env.AdminKubeconfig(dir); err != nil {
		c.stop()
		return nil, err
	}
	return c, nil
}

// stop ends the simulated nodes' stand-in daemons, the API server and etcd, and removes the work dir.
func (c *cluster) stop() {
	c.stopScheduler()
	simnode.StopDaemons(c.dir)
	_ = c.env.Stop()
	_ = os.RemoveAll(c.dir)
}

// runController starts the same controllers cmd/manager runs.
func (c *cluster) runController(ctx context.Context, errs chan<- error) error {
	mgr, err := ctrl.NewManager(c.env.Config, ctrl.Options{
		Scheme:  c.env.Scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
	})
	if err != nil {
		return fmt.Errorf("creating the controller manager: %w", err)
	}
	if err := setup.Controllers(ctx, mgr, setup.Options{ResolverWorkers: 4, StatusWorkers: 2, SkipNameValidation: true,
		Rightsizing: rightsizingOptions()}); err != nil {
		return err
	}
	go func() {
		if err := mgr.Start(ctx); err != nil {
			errs <- fmt.Errorf("controller: %w", err)
		}
	}()
	return nil
}

// applySamplePolicies creates every GPUSharingPolicy in config/samples (the GPUNode sample describes a
// node that does not exist here, so it is skipped) and returns their names.
func (c *cluster) applySamplePolicies(ctx context.Context) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(c.env.RepoRoot, "config", "samples", "*.yaml"))
	if err != nil {
		return nil, err
	}
	var names []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var meta metav1.TypeMeta
		if err := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096).Decode(&meta); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		if meta.Kind != "GPUSharingPolicy" {
			continue
		}
		p := &v1alpha1.GPUSharingPolicy{}
		if err := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096).Decode(p); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		if err := c.env.Client.Create(ctx, p); err != nil {
			return nil, fmt.Errorf("applying %s: %w", filepath.Base(f), err)
		}
		names = append(names, p.Name)
	}
	sort.Strings(names)
	return names, nil
}

// printTable runs the real kubectl, as a user would.
func (c *cluster) printTable(w io.Writer) error {
	res, err := runner.Exec{}.Run(context.Background(), runner.Cmd{Path: c.kubectl, Args: []string{"--kubeconfig", c.kubeconfig, "get", "gpusharing", "-o", "wide"}})
	if _, werr := fmt.Fprint(w, "$ kubectl get gpusharing -o wide\n", res.Stdout, res.Stderr); werr != nil {
		return werr
	}
	if err != nil {
		return fmt.Errorf("kubectl get gpusharing: %w", err)
	}
	return nil
}

// printSlices runs `kubectl get resourceslices` and sums each node's published devices by kind of
// share, the DRA view of the table above.
func (c *cluster) printSlices(ctx context.Context, w io.Writer) error {
	if err := c.waitSlices(ctx); err != nil {
		return err
	}
	res, err := runner.Exec{}.Run(ctx, runner.Cmd{Path: c.kubectl, Args: []string{"--kubeconfig", c.kubeconfig, "get", "resourceslices"}})
	if _, werr := fmt.Fprint(w, "\n$ kubectl get resourceslices\n", res.Stdout, res.Stderr); werr != nil {
		return werr
	}
	if err != nil {
		return fmt.Errorf("kubectl get resourceslices: %w", err)
	}
	var list resourcev1.ResourceSliceList
	if err := c.env.Client.List(ctx, &list); err != nil {
		return err
	}
	kinds := map[string]map[string]int{}
	for _, s := range list.Items {
		if s.Spec.Driver != dra.DriverName || s.Spec.NodeName == nil {
			continue
		}
		node := *s.Spec.NodeName
		if kinds[node] == nil {
			kinds[node] = map[string]int{}
		}
		for _, d := range s.Spec.Devices {
			if a, ok := d.Attributes[dra.AttrShare]; ok && a.StringValue != nil {
				kinds[node][*a.StringValue]++
			}
		}
	}
	nodes := make([]string, 0, len(kinds))
	for n := range kinds {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	if _, err := fmt.Fprintf(w, "\nDRA devices per node (driver %s; a claim asks for a DeviceClass gpusharing-<share>):\n", dra.DriverName); err != nil {
		return err
	}
	for _, n := range nodes {
		var parts []string
		for k, v := range kinds[n] {
			parts = append(parts, fmt.Sprintf("%d %s", v, k))
		}
		sort.Strings(parts)
		if _, err := fmt.Fprintf(w, "  %-12s %s\n", n, strings.Join(parts, ", ")); err != nil {
			return err
		}
	}
	return nil
}

// waitSlices waits (bounded) until every node's slices publish what its GPUNode status offers: an agent
// publishes in the pass that writes the status, so the two agree within a pass or two.
func (c *cluster) waitSlices(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	differ := "not listed yet"
	for {
		d, err := c.slicesDiffer(ctx)
		switch {
		case err == nil && d == "":
			return nil
		case err == nil:
			differ = d
		case ctx.Err() == nil:
			differ = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("ResourceSlices do not follow the GPUNode status within 30s: %s", differ)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// slicesDiffer names a node whose published devices differ from its status's, or "".
func (c *cluster) slicesDiffer(ctx context.Context) (string, error) {
	var nodes v1alpha1.GPUNodeList
	if err := c.env.Client.List(ctx, &nodes); err != nil {
		return "", err
	}
	var slices resourcev1.ResourceSliceList
	if err := c.env.Client.List(ctx, &slices); err != nil {
		return "", err
	}
	published := map[string][]string{}
	for _, s := range slices.Items {
		if s.Spec.Driver == dra.DriverName && s.Spec.NodeName != nil {
			for _, d := range s.Spec.Devices {
				published[*s.Spec.NodeName] = append(published[*s.Spec.NodeName], d.Name)
			}
		}
	}
	for _, n := range nodes.Items {
		var want []string
		for _, d := range dra.Devices(n.Status, share.Config{}) {
			want = append(want, d.Name)
		}
		got := published[n.Name]
		sort.Strings(got)
		sort.Strings(want)
		if strings.Join(got, " ") != strings.Join(want, " ") {
			return fmt.Sprintf("%s publishes %v, its status offers %v", n.Name, got, want), nil
		}
	}
	return "", nil
}
