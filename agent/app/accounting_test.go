package app

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/prom"
)

// podSeries reports whether the registry serves a per-pod memory series for the pod.
func podSeries(t *testing.T, pod string) bool {
	t.Helper()
	_, found := prom.Find(t, metrics.Registry, "gpusharing_pod_gpu_memory_used_bytes", map[string]string{"pod": pod})
	return found
}

// accountedPod creates the pod name on the node whose process pid, on the mock GPUs, the accounting names
// through its cgroup file under procRoot.
func accountedPod(t *testing.T, name, node, procRoot string, pid int) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "main", Image: "trainer"}}},
	}
	if err := env.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), pod) })
	cid := fmt.Sprintf("%x", sha256.Sum256([]byte(name))) // a runtime id: 64 hex digits
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", ContainerID: "containerd://" + cid, Image: "trainer", ImageID: "trainer"}}
	if err := env.Client.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(procRoot, fmt.Sprint(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cg := fmt.Sprintf("0::/kubepods/burstable/pod%s/%s\n", pod.UID, cid)
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cg), 0o644); err != nil {
		t.Fatal(err)
	}
	return pod
}

// TestAgentAccountsAPodsProcessInStatusAndMetrics runs the agent as cmd/agent builds it with the
// accounting on: a process on a mock GPU whose cgroup file names a pod of this node shows in the GPU's
// status.usage with its pod and container (from the pod's status in the API server) and as a per-pod
// series; when it leaves, both go.
func TestAgentAccountsAPodsProcessInStatusAndMetrics(t *testing.T) {
	procRoot := t.TempDir()
	n := startNodeWith(t, 1, func(o *Options) {
		o.ProcRoot = procRoot
		o.Accounting = &AccountingOptions{Interval: 100 * time.Millisecond}
	})
	ctx := context.Background()
	const pid = 4242
	pod := accountedPod(t, "acct-"+n.name, n.name, procRoot, pid)
	g0 := n.gpus.GPUs[0]
	g0.SetUsage(nvmlmock.Proc(pid, 2<<30, 50))
	// NVML's samples keep coming while the process runs: a read whose window holds none reads the
	// process idle, and on a loaded machine two reads can fall between two looks at the status.
	sampling, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	go func() {
		for sampling.Err() == nil {
			g0.AdvanceSamples(20_000)
			time.Sleep(20 * time.Millisecond)
		}
	}()

	n.waitFor(t, "the GPU lists the pod's container", func(g *v1alpha1.GPUNode) (bool, string) {
		u := g.Status.GPUs[0].Usage
		if u == nil || len(u.Consumers) != 1 {
			return false, fmt.Sprintf("usage %+v", u)
		}
		c := u.Consumers[0]
		ok := c.Namespace == "default" && c.Pod == pod.Name && c.Container == "main" && c.Memory != nil && c.Memory.Value() == 2<<30 &&
			c.SMUtilization != nil && *c.SMUtilization == 50 && strings.HasPrefix(g.Status.MemoryUsed, "0:2Gi/")
		return ok, fmt.Sprintf("consumer %+v, memoryUsed %q", c, g.Status.MemoryUsed)
	})
	if !podSeries(t, pod.Name) {
		t.Errorf("no per-pod series for %s", pod.Name)
	}

	g0.SetUsage()
	n.waitFor(t, "the pod's container leaves the status", func(g *v1alpha1.GPUNode) (bool, string) {
		u := g.Status.GPUs[0].Usage
		return u != nil && len(u.Consumers) == 0, fmt.Sprintf("usage %+v", u)
	})
	if podSeries(t, pod.Name) {
		t.Errorf("the per-pod series of %s outlived its process", pod.Name)
	}
}
