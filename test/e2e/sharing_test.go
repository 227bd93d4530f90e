//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// wantAllocatable is what the kubelet must list for testdata/mixed-policies.yaml on an 8-GPU H100 node:
// per MIG GPU one 3g.40gb and four 1g.10gb, per MPS GPU 4 replicas, per time-sliced GPU 2, per shim GPU the
// agent's default 4 shares, and no whole GPU left.
var wantAllocatable = map[corev1.ResourceName]int64{
	"nvidia.com/mig-3g.40gb":      2,
	"nvidia.com/mig-1g.10gb":      8,
	"gpusharing.io/gpu-mps":       8,
	"gpusharing.io/gpu-timeslice": 4,
	"gpusharing.io/gpu-shared":    8,
	"nvidia.com/gpu":              0,
}

// testSharing applies a policy per strategy and waits until the real kubelet's allocatable (read as an
// operator would, with kubectl's jsonpath) has every kind of share with its count.
func testSharing(t *testing.T) {
	dumpOnFailure(t)
	kubectl(t, "apply", "-f", "test/e2e/testdata/mixed-policies.yaml")
	for _, p := range []string{"e2e-mig", "e2e-mps", "e2e-timeslice", "e2e-shim"} {
		kubectl(t, "wait", "--for=condition=Ready", "gpusharingpolicy/"+p, "--timeout=180s")
	}
	eventually(t, 2*time.Minute, "the kubelet's allocatable", func(ctx context.Context) error {
		return allocatableIs(ctx, wantAllocatable)
	})
	for name, want := range wantAllocatable {
		got := kubectl(t, "get", "node", NodeName, "-o", fmt.Sprintf("jsonpath={.status.allocatable.%s}", jsonpathKey(string(name))))
		if want == 0 && (got == "" || got == "0") {
			continue
		}
		if got != fmt.Sprint(want) {
			t.Errorf("kubectl jsonpath allocatable %s = %q, want %d", name, got, want)
		}
	}
	t.Log(kubectl(t, "get", "gpusharing", "-o", "wide"))
}

func allocatableIs(ctx context.Context, want map[corev1.ResourceName]int64) error {
	var n corev1.Node
	if err := k8s.Get(ctx, client.ObjectKey{Name: NodeName}, &n); err != nil {
		return err
	}
	for name, count := range want {
		q, ok := n.Status.Allocatable[name]
		if !ok {
			q = resource.Quantity{}
		}
		if q.Value() != count {
			return fmt.Errorf("allocatable %s = %s, want %d", name, q.String(), count)
		}
	}
	return nil
}

// jsonpathKey escapes the dots of a resource name for kubectl's jsonpath.
func jsonpathKey(name string) string {
	out := ""
	for _, r := range name {
		if r == '.' {
			out += `\.`
		} else {
			out += string(r)
		}
	}
	return out
}
