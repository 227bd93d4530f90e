package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/gpusharing/gpusharing/agent/runner"
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
	if err := setup.Controllers(ctx, mgr, setup.Options{ResolverWorkers: 4, StatusWorkers: 2, SkipNameValidation: true}); err != nil {
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
