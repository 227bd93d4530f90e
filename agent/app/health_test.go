package app

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

func healthy(g *v1alpha1.GPUNode, uuid string) *metav1.Condition {
	st := gpuState(g, uuid)
	if st == nil {
		return nil
	}
	return meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionHealthy)
}

func TestACriticalXidMarksTheGPUUnhealthyInStatusAndAtTheKubelet(t *testing.T) {
	n := startNode(t, 2)
	ok, bad := n.uuid(0), n.uuid(1)
	n.setSpec(t, v1alpha1.GPUDesired{UUID: ok, Index: 0, Sharing: exclusive()}, v1alpha1.GPUDesired{UUID: bad, Index: 1, Sharing: exclusive()})
	n.waitDevices(t, "both exclusive GPUs advertised healthy", "nvidia.com/gpu", map[string]string{ok: "Healthy", bad: "Healthy"})

	// An application's fault (Xid 13) on GPU 0 is not the GPU's; Xid 79 on GPU 1 is.
	n.events.PushXid(0, 13)
	n.events.PushXid(1, 79)

	g := n.waitFor(t, "GPU 1 reported unhealthy", func(g *v1alpha1.GPUNode) (bool, string) {
		c := healthy(g, bad)
		if c == nil {
			return false, "no Healthy condition"
		}
		return c.Status == metav1.ConditionFalse, c.Reason + ": " + c.Message
	})
	if c := healthy(g, bad); c.Reason != "XidError" || !strings.Contains(c.Message, "Xid 79") {
		t.Errorf("GPU 1's Healthy condition = %s %q, want XidError naming Xid 79", c.Reason, c.Message)
	}
	if c := healthy(g, ok); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("GPU 0 turned unhealthy from an application Xid: %+v", c)
	}
	n.waitDevices(t, "the kubelet sees GPU 1 unhealthy and GPU 0 healthy", "nvidia.com/gpu", map[string]string{ok: "Healthy", bad: "Unhealthy"})
}
