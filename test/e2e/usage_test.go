//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/prom"
	"github.com/gpusharing/gpusharing/test/testenv"
)

// usagePods are the Usage scenario's workloads: what each declares it uses of its simulated GPU.
var usagePods = []struct {
	name, resource, image string
	command               []string
	memoryMiB, smPercent  int
}{
	{"usage-mps", "gpusharing.io/gpu-mps", BusyboxImage, []string{"/bin/sh", "-c", "exec sleep 3600"}, 3072, 30},
	// The shim's test client over its stub driver: a shim client of the GPU's scheduler, so the per-pod
	// lock and swap series have a pod to name. It is the container's only process (no shell before it),
	// so the declared memory is counted once.
	{"usage-shim", "gpusharing.io/gpu-shared", "gpusharing.io/e2e/shim-worker:1", []string{"/client", "dlsym", "100000", "20000"}, 1536, 20},
}

// testUsage runs pods on an MPS share, a shim share and a sized claim (sized_test.go), each declaring GPU
// use to the simulated GPUs (nvmlmock.EnvSimulatedMemoryMiB), and checks the per-pod accounting end to
// end: the GPUNode lists each pod with its memory; a real Prometheus scraping the manager and the agent on
// this node evaluates every dashboard and alert query, each returning series (returnsSeries); and the
// pods' series and consumers leave when the pods do.
func testUsage(t *testing.T) {
	dumpOnFailure(t)
	ctx := context.Background()
	ensureNamespace(t)
	for _, u := range usagePods {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: u.name, Namespace: Namespace},
			Spec: corev1.PodSpec{
				TerminationGracePeriodSeconds: ptr(int64(1)),
				Containers: []corev1.Container{{
					Name: "work", Image: u.image, ImagePullPolicy: corev1.PullNever, Command: u.command,
					Env: []corev1.EnvVar{
						{Name: nvmlmock.EnvSimulatedMemoryMiB, Value: strconv.Itoa(u.memoryMiB)},
						{Name: nvmlmock.EnvSimulatedSMPercent, Value: strconv.Itoa(u.smPercent)},
						{Name: "GPUSHARE_STUB_LAUNCH_US", Value: "10"},
					},
					Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceName(u.resource): *resourceQuantity(1)}},
				}},
			},
		}
		must(t, k8s.Create(ctx, pod))
	}
	for _, u := range usagePods {
		kubectl(t, "-n", Namespace, "wait", "--for=condition=Ready", "pod/"+u.name, "--timeout=90s")
	}
	eventually(t, time.Minute, "the GPUNode listing both pods with their memory", func(ctx context.Context) error {
		for _, u := range usagePods {
			if err := consumerListed(ctx, u.name, int64(u.memoryMiB)<<20); err != nil {
				return err
			}
		}
		return nil
	})
	eventually(t, time.Minute, "usage-shim listed as a shim client", func(ctx context.Context) error {
		return shimClientListed(ctx, Namespace+"/usage-shim")
	})

	startSizedClaimPod(t)

	if prom.Binary() == "" {
		t.Fatal("prometheus is not installed: make e2e installs Debian's package (make e2e-deps)")
	}
	// The manager's and the agent's metrics ports are on the host network, bound to loopback; they serve
	// HTTPS (self-signed) to a token bound to gpusharing-metrics-reader, as a Prometheus in the cluster
	// scrapes them (charts/gpusharing's ServiceMonitor, config/prometheus/scrape.yaml).
	token := metricsTokenFile(t)
	p := prom.Start(t,
		prom.Target{Job: "gpusharing-manager", Addr: "127.0.0.1:8080", HTTPS: true, TokenFile: token},
		prom.Target{Job: "gpusharing-agent", Addr: "127.0.0.1:9081", HTTPS: true, TokenFile: token})
	p.TargetsUp(t, 90*time.Second)
	queries, err := prom.DashboardAndAlertQueries(testenv.RepoRoot())
	must(t, err)
	for _, q := range queries {
		var evalErr error
		eventually(t, 90*time.Second, q.Where+" returning series", func(context.Context) error {
			if _, err := p.Query(q.Expr); err != nil {
				evalErr = err
				return nil // a query that does not evaluate will not start to
			}
			return returnsSeries(p, q)
		})
		if evalErr != nil {
			t.Errorf("%s: %q does not evaluate in Prometheus: %v", q.Where, q.Expr, evalErr)
		}
	}
	// The figures Prometheus holds are the declared ones: the accounting read them through NVML.
	res, err := p.Query(`gpusharing_pod_gpu_memory_used_bytes{namespace="` + Namespace + `"}`)
	must(t, err)
	for _, s := range res {
		for _, u := range usagePods {
			if want := strconv.FormatInt(int64(u.memoryMiB)<<20, 10); s.Metric["pod"] == u.name && s.Value[1] != want {
				t.Errorf("%s's memory series is %v, want %s bytes", u.name, s.Value[1], want)
			}
		}
	}

	kubectl(t, "-n", Namespace, "delete", "pod", "usage-mps", "usage-shim", "--wait=true", "--timeout=60s")
	stopSizedClaimPod(t)
	eventually(t, time.Minute, "the pods' consumers and series gone", func(ctx context.Context) error {
		for _, u := range usagePods {
			if err := consumerListed(ctx, u.name, 0); err == nil {
				return fmt.Errorf("%s still listed among the GPUNode's consumers", u.name)
			}
		}
		res, err := p.Query(`gpusharing_pod_gpu_memory_used_bytes{namespace="` + Namespace + `"}`)
		if err != nil {
			return err
		}
		if len(res) > 0 {
			return fmt.Errorf("%d per-pod series left in Prometheus: %v", len(res), res)
		}
		return nil
	})
}

// errNotListed says a pod is not among any GPU's consumers.
var errNotListed = errors.New("not among the GPUNode's consumers")

// consumerListed says whether a GPU of the node lists the pod among its consumers with memory bytes
// (any memory when memory is 0).
func consumerListed(ctx context.Context, pod string, memory int64) error {
	var gn v1alpha1.GPUNode
	if err := k8s.Get(ctx, client.ObjectKey{Name: NodeName}, &gn); err != nil {
		return err
	}
	var seen []string
	for _, g := range gn.Status.GPUs {
		if g.Usage == nil {
			continue
		}
		for _, c := range g.Usage.Consumers {
			seen = append(seen, fmt.Sprintf("GPU %d %s/%s %v", g.Index, c.Namespace, c.Pod, c.Memory))
			if c.Namespace != Namespace || c.Pod != pod {
				continue
			}
			if memory == 0 || c.Memory != nil && c.Memory.Value() == memory {
				return nil
			}
		}
	}
	return fmt.Errorf("%s/%s with %d bytes: %w (listed: %v)", Namespace, pod, memory, errNotListed, seen)
}

// returnsSeries says whether q returns the series it must while the scenario's pods run. A dashboard panel
// returns series; a per-pod one names the pods its series exist for (the shim's only the shim client, the
// others all three). An alert's operands (what it compares) return series whether or not it fires, and
// the claim alert fires for sizedPod, which uses more than its claim.
func returnsSeries(p *prom.Server, q prom.Query) error {
	queries := []string{q.Expr}
	if q.Alert() {
		queries = q.Inputs()
	}
	for _, expr := range queries {
		res, err := p.Query(expr)
		if err != nil {
			return err
		}
		if len(res) == 0 {
			return fmt.Errorf("%q returns no series", expr)
		}
	}
	var want []string
	switch {
	case q.Alert() && strings.Contains(q.Expr, "gpusharing_pod_claim_"):
		want = []string{sizedPod}
	case q.Alert() || !q.PerPod():
		return nil
	case strings.Contains(q.Expr, "_shim_"):
		want = []string{"usage-shim"}
	default:
		want = []string{"usage-shim", "usage-mps", sizedPod}
	}
	res, err := p.Query(q.Expr)
	if err != nil {
		return err
	}
	var got []string
	for _, s := range res {
		if s.Metric["namespace"] == Namespace {
			got = append(got, s.Metric["pod"])
		}
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			return fmt.Errorf("%q: series for pods %v, want %v among them", q.Expr, got, want)
		}
	}
	return nil
}
