//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// shareResources are the resource names the agent advertises.
var shareResources = []corev1.ResourceName{"nvidia.com/gpu", "nvidia.com/mig-3g.40gb", "nvidia.com/mig-1g.10gb",
	"gpusharing.io/gpu-mps", "gpusharing.io/gpu-timeslice", "gpusharing.io/gpu-shared"}

// testKubeletRestart restarts the kubelet (which forgets every device plugin and removes their sockets):
// the agent registers each resource again and the allocatable counts come back unchanged, while a running
// pod keeps its container.
func testKubeletRestart(t *testing.T) {
	dumpOnFailure(t)
	ctx := context.Background()
	must(t, k8s.Create(ctx, sharePod("survivor", "gpusharing.io/gpu-timeslice", 1, nil)))
	kubectl(t, "-n", Namespace, "wait", "--for=condition=Ready", "pod/survivor", "--timeout=60s")
	want := allocatable(t)
	before := containerIDs(t, "survivor")
	_, logEnd := node.KubeletLog(0)
	restartedAt := time.Now()
	must(t, node.RestartKubelet(ctx))
	must(t, node.WaitReady(ctx, 2*time.Minute))
	// The new kubelet knows no plugin until each registers again: wait for every advertised resource's
	// registration in its log, then for the node status it writes after them.
	eventually(t, 2*time.Minute, "every resource registered with the new kubelet", func(ctx context.Context) error {
		log, _ := node.KubeletLog(logEnd)
		for r, n := range want {
			if n > 0 && !strings.Contains(log, fmt.Sprintf(`"Got registration request from device plugin with resource" resourceName=%q`, r)) {
				return fmt.Errorf("%s not registered yet", r)
			}
		}
		return nil
	})
	registered := time.Now()
	eventually(t, 2*time.Minute, "allocatable back as before the restart", func(ctx context.Context) error {
		if err := heartbeatAfter(ctx, registered); err != nil {
			return err
		}
		return allocatableIs(ctx, want)
	})
	t.Logf("allocatable %v back %s after the kubelet restart", want, time.Since(restartedAt).Round(time.Second))
	// The kubelet marks a restarted node's pods Ready again once it has re-synced them.
	kubectl(t, "-n", Namespace, "wait", "--for=condition=Ready", "pod/survivor", "--timeout=60s")
	if after := containerIDs(t, "survivor"); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("a running pod was disturbed by the kubelet restart: %v before, %v after", before, after)
	}
	kubectl(t, "-n", Namespace, "delete", "pod/survivor", "--wait=true", "--timeout=60s")
}

// heartbeatAfter is nil once the kubelet has written node status after t.
func heartbeatAfter(ctx context.Context, t time.Time) error {
	var n corev1.Node
	if err := k8s.Get(ctx, client.ObjectKey{Name: NodeName}, &n); err != nil {
		return err
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.LastHeartbeatTime.After(t) {
			return nil
		}
	}
	return fmt.Errorf("no node status written since %s", t.Format(time.RFC3339))
}

func allocatable(t *testing.T) map[corev1.ResourceName]int64 {
	t.Helper()
	var n corev1.Node
	must(t, k8s.Get(context.Background(), client.ObjectKey{Name: NodeName}, &n))
	out := map[corev1.ResourceName]int64{}
	for _, r := range shareResources {
		q := n.Status.Allocatable[r]
		out[r] = q.Value()
	}
	return out
}

// testUninstall is docs/deploy.md's removal: deleting the policies returns the GPUs to Exclusive (their
// finalizers wait for the agent to confirm), then `kubectl delete -k` removes every object it created.
func testUninstall(t *testing.T) {
	dumpOnFailure(t)
	kubectl(t, "delete", "gpusharingpolicies", "--all", "--wait=true", "--timeout=180s")
	eventually(t, 2*time.Minute, "every GPU Exclusive", func(ctx context.Context) error {
		for i := int32(0); i < 8; i++ {
			if err := gpuApplied(ctx, i, "Exclusive"); err != nil {
				return err
			}
		}
		return nil
	})
	kubectl(t, "delete", "-k", "config/e2e/deviceplugin", "--wait=true", "--timeout=180s")
	kubectl(t, "delete", "namespace", Namespace, "--wait=true", "--timeout=120s")
	eventually(t, 2*time.Minute, "nothing of gpusharing left", func(ctx context.Context) error {
		var left []string
		for _, kind := range []string{"crd", "clusterrole", "clusterrolebinding", "validatingadmissionpolicy", "validatingadmissionpolicybinding", "namespace", "deviceclass"} {
			out, err := kubectlErr("get", kind, "-o", "name")
			if err != nil {
				return fmt.Errorf("kubectl get %s: %v: %s", kind, err, out)
			}
			for _, name := range strings.Fields(out) {
				if strings.Contains(name, "gpusharing") {
					left = append(left, name)
				}
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("still there: %v", left)
		}
		return nil
	})
}
