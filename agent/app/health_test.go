package app

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/wait"
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

	// The transition is an event on the GPUNode whose reason is the condition's, and only one: later
	// passes that find the GPU still unhealthy make none.
	var events []string
	wait.Until(t, 30*time.Second, func() bool {
		events = gpuNodeEvents(t, n.name, "XidError")
		return len(events) > 0
	}, "an XidError event on GPUNode %s", n.name)
	if len(events) != 1 || !strings.Contains(events[0], "GPU 1") || !strings.Contains(events[0], "Xid 79") {
		t.Errorf("XidError events on GPUNode %s: %q, want one Warning naming GPU 1 and Xid 79", n.name, events)
	}
	for _, e := range gpuNodeEvents(t, n.name, v1alpha1.ReasonAsDesired) {
		// A GPU first seen healthy is no news: no Healthy=True event at start.
		if strings.Contains(e, "Healthy:") {
			t.Errorf("event %q at start; want none for a GPU first seen healthy", e)
		}
	}
}

// gpuNodeEvents lists "type: note" of the events about a GPUNode with the given reason.
func gpuNodeEvents(t *testing.T, name, reason string) []string {
	t.Helper()
	return eventsAbout(t, "GPUNode", name, reason)
}

// eventsAbout lists "type: note" of the events about an object of kind and name with the given reason.
func eventsAbout(t *testing.T, kind, name, reason string) []string {
	t.Helper()
	var list eventsv1.EventList
	if err := env.Client.List(context.Background(), &list); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Kind == kind && e.Regarding.Name == name && e.Reason == reason {
			out = append(out, e.Type+": "+e.Note)
			if e.Series != nil {
				// The recorder folds a repeated event into a series: the transition was emitted again.
				out = append(out, fmt.Sprintf("repeated %d times", e.Series.Count))
			}
		}
	}
	return out
}
