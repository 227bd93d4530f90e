//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// workerLaunches × workerSleepUS is how long the shim worker runs: long enough to span the agent's
// rolling update (its launches take the GPU lock through the scheduler the agent serves).
const (
	workerLaunches = 4000
	workerSleepUS  = 20000
)

// workerScript runs the shim's test client (dynamically linked: LD_PRELOAD from Allocate loads
// libgpushare.so into it) in the background and reports, once a second, that it is alive; at the end
// its own summary and exit status. busybox sh is static, so only the client loads the shim.
var workerScript = fmt.Sprintf(`/client dlsym %d %d 2>&1 &
pid=$!
while kill -0 $pid 2>/dev/null; do echo "alive $(date +%%s)"; sleep 1; done
wait $pid; rc=$?
echo "client exit=$rc"
exec sleep 3600`, workerLaunches, workerSleepUS)

// testUpgrade rolls the agent DaemonSet to a new image tag while a process using the shim runs in a pod:
// the process is neither killed nor corrupted (it completes every launch and exits 0, in the same
// container), and the new agent's scheduler serves it (it is listed among the GPU's shim clients again).
func testUpgrade(t *testing.T) {
	dumpOnFailure(t)
	ctx := context.Background()
	ensureNamespace(t)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "shim-worker", Namespace: Namespace},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr(int64(1)),
			Containers: []corev1.Container{{
				Name: "worker", Image: "gpusharing.io/e2e/shim-worker:1", ImagePullPolicy: corev1.PullNever,
				Command:   []string{"/bin/sh", "-c", workerScript},
				Env:       []corev1.EnvVar{{Name: "GPUSHARE_STUB_LAUNCH_US", Value: "10"}},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"gpusharing.io/gpu-shared": *resourceQuantity(1)}},
			}},
		},
	}
	must(t, k8s.Create(ctx, pod))
	kubectl(t, "-n", Namespace, "wait", "--for=condition=Ready", "pod/shim-worker", "--timeout=60s")
	eventually(t, time.Minute, "the worker listed as a shim client", func(ctx context.Context) error {
		return shimClientListed(ctx, "e2e/shim-worker")
	})
	before := containerIDs(t, "shim-worker")
	oldAgent := agentPodUID(t)

	// A new release: the same image under a new tag, as a registry push would give.
	must(t, node.TagImage(ctx, "docker.io/gpusharing/agent:e2e", "docker.io/gpusharing/agent:e2e-next"))
	kubectl(t, "-n", "gpusharing-system", "set", "image", "daemonset/gpusharing-agent", "agent=gpusharing/agent:e2e-next", "install-shim=gpusharing/agent:e2e-next")
	kubectl(t, "-n", "gpusharing-system", "rollout", "status", "daemonset/gpusharing-agent", "--timeout=180s")
	if agentPodUID(t) == oldAgent {
		t.Fatal("the agent pod was not replaced")
	}
	// The new agent process's own metrics (its metrics port is on the host network): a client connected
	// to its scheduler and lock grants made by it. Only the worker uses the shim, and status could still
	// hold what the old agent wrote, so the counters of the fresh process are the proof.
	token := metricsToken(t)
	eventually(t, time.Minute, "the new agent's scheduler serving the worker", func(ctx context.Context) error {
		if err := schedulerServes(ctx, token); err != nil {
			return err
		}
		return shimClientListed(ctx, "e2e/shim-worker")
	})
	eventually(t, 3*time.Minute, "the worker finishing", func(ctx context.Context) error {
		out, err := kubectlErr("-n", Namespace, "logs", "shim-worker")
		if err != nil || !strings.Contains(out, "client exit=") {
			return fmt.Errorf("%v: %s", err, tail(out))
		}
		if !strings.Contains(out, "client exit=0") || !strings.Contains(out, fmt.Sprintf("launches=%d", workerLaunches)) {
			t.Fatalf("the shim process did not complete cleanly across the upgrade:\n%s", tail(out))
		}
		return nil
	})
	if after := containerIDs(t, "shim-worker"); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("the worker's container changed: %v before, %v after", before, after)
	}
	kubectl(t, "-n", Namespace, "delete", "pod/shim-worker", "--wait=true", "--timeout=60s")
}

// agentMetrics is the agent's metrics endpoint (config/e2e binds it on the node's loopback).
const agentMetrics = "https://127.0.0.1:9081/metrics"

// schedulerServes reads the agent's metrics with the scraper's token: at least one shim client
// connected and at least one grant.
func schedulerServes(ctx context.Context, token string) error {
	body, err := scrapeMetrics(ctx, agentMetrics, token)
	if err != nil {
		return err
	}
	var clients, grants float64
	for _, line := range strings.Split(body, "\n") {
		name, value, ok := strings.Cut(line, " ")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(name, "gpusharing_scheduler_clients{") || name == "gpusharing_scheduler_clients":
			clients += v
		case strings.HasPrefix(name, "gpusharing_scheduler_wait_seconds_count"):
			grants += v
		}
	}
	if clients < 1 || grants < 1 {
		return fmt.Errorf("agent metrics: %v shim clients connected, %v grants", clients, grants)
	}
	return nil
}

func tail(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return strings.Join(lines, "\n")
}

func agentPodUID(t *testing.T) string {
	t.Helper()
	var l corev1.PodList
	must(t, k8s.List(context.Background(), &l, client.InNamespace("gpusharing-system"), client.MatchingLabels{"app.kubernetes.io/name": "gpusharing-agent"}))
	var uids []string
	for _, p := range l.Items {
		if p.DeletionTimestamp == nil {
			uids = append(uids, string(p.UID))
		}
	}
	return strings.Join(uids, ",")
}

// shimClientListed says whether GPUNode status lists the pod among a GPU's shim clients.
func shimClientListed(ctx context.Context, pod string) error {
	var gn v1alpha1.GPUNode
	if err := k8s.Get(ctx, client.ObjectKey{Name: NodeName}, &gn); err != nil {
		return err
	}
	var seen []string
	for _, g := range gn.Status.GPUs {
		if g.Applied == nil || g.Applied.Shim == nil {
			continue
		}
		for _, c := range g.Applied.Shim.Clients {
			if c.Pod == pod {
				return nil
			}
			seen = append(seen, fmt.Sprintf("%s(pid %d)", c.Pod, c.PID))
		}
	}
	return fmt.Errorf("%s not among the shim clients %v", pod, seen)
}
