package dra_test

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// xidNode is a dynamic H100 with two 1g.10gb claim instances: at placement 0 hit by Xid 79, at 1 healthy.
func xidNode(t *testing.T) v1alpha1.GPUNodeStatus {
	t.Helper()
	in := func(start int32, claim, unhealthy string) v1alpha1.MIGInstanceStatus {
		return v1alpha1.MIGInstanceStatus{Profile: "1g.10gb", Placement: v1alpha1.MIGPlacement{Start: start, Size: 1},
			Claim: &v1alpha1.MIGClaimRef{Namespace: "default", Name: claim, UID: "uid-" + claim}, Unhealthy: unhealthy}
	}
	return dynamicNode(t, []string{"1g.10gb", "2g.20gb"},
		in(0, "hit", "Xid 79: GPU has fallen off the bus at 2026-11-22T10:05:00Z"), in(1, "fine", ""))
}

func taintsOf(devs []resourcev1.Device) map[string][]resourcev1.DeviceTaint {
	out := map[string][]resourcev1.DeviceTaint{}
	for _, d := range devs {
		if len(d.Taints) > 0 {
			out[d.Name] = d.Taints
		}
	}
	return out
}

func TestAnUnhealthyInstanceTaintsItsPlacementDeviceAlone(t *testing.T) {
	st := xidNode(t)
	devs := dra.Devices(st, share.DefaultConfig())
	healthy := xidNode(t)
	healthy.GPUs[0].Applied.MIGInstances[0].Unhealthy = ""
	if got, want := devicesOf(st), devicesOf(healthy); got != want {
		t.Errorf("devices %s\nwant the healthy GPU's %s", got, want)
	}
	taints := taintsOf(devs)
	want := resourcev1.DeviceTaint{Key: dra.TaintUnhealthy, Value: "Xid-79", Effect: resourcev1.DeviceTaintEffectNoSchedule}
	if len(taints) != 1 || len(taints["gpu-0-mig-1g-10gb-0"]) != 1 || taints["gpu-0-mig-1g-10gb-0"][0] != want {
		t.Errorf("taints %+v; want %+v on gpu-0-mig-1g-10gb-0 alone", taints, want)
	}
	// A message that is not an Xid's gives a taint without a value (a label value cannot hold it).
	st.GPUs[0].Applied.MIGInstances[0].Unhealthy = "double-bit ECC error at 2026-11-22T10:05:00Z"
	if got := taintsOf(dra.Devices(st, share.DefaultConfig()))["gpu-0-mig-1g-10gb-0"]; len(got) != 1 || got[0].Value != "" {
		t.Errorf("taints %+v; want one without a value", got)
	}
}

// With the real API server and kube-scheduler v1.36.3 (DRADeviceTaints beta, on by default): the taint
// is stored, the scheduler allocates no claim the tainted placement although its counters are free, and
// every other placement still goes to claims.
func TestTheSchedulerSkipsATaintedPlacementAndAllocatesTheOthers(t *testing.T) {
	ctx, env := draCluster(t)
	c := env.Client
	st := xidNode(t)
	// The claims of the two instances are not in the API: every 1g placement's counters are free.
	p := startPublisher(t, env, dra.PublisherOptions{})
	p.PublishStatus(nodeOf(st))
	waitPublished(t, ctx, c, devicesOf(st))
	stored := taintsOf(func() []resourcev1.Device {
		var all []resourcev1.Device
		for _, s := range nodeSlices(t, ctx, c) {
			all = append(all, s.Spec.Devices...)
		}
		return all
	}())
	if tt := stored["gpu-0-mig-1g-10gb-0"]; len(stored) != 1 || len(tt) != 1 || tt[0].Key != dra.TaintUnhealthy ||
		tt[0].Effect != resourcev1.DeviceTaintEffectNoSchedule || tt[0].TimeAdded == nil {
		t.Fatalf("stored taints %+v; want the NoSchedule taint, with the API server's timeAdded, on gpu-0-mig-1g-10gb-0 alone", stored)
	}
	startScheduler(t, env)

	got := map[string]bool{}
	for _, name := range []string{"a", "b", "c", "d", "e", "f"} {
		migClaimPod(t, ctx, c, name, "1g.10gb")
		got[allocated(t, ctx, c, name)] = true
	}
	if got["gpu-0-mig-1g-10gb-0"] || len(got) != 6 {
		t.Errorf("six 1g.10gb claims got %v; want placements 1 to 6, never the tainted 0", got)
	}
	migClaimPod(t, ctx, c, "g", "1g.10gb")
	if msg := pendingReason(t, ctx, c, "g"); !strings.Contains(msg, "cannot allocate all claims") {
		t.Errorf("pod g, with only the tainted placement left, is pending with %q", msg)
	}
}

// Where the API server does not serve device taints (DRADeviceTaints off) it would store the device
// untainted and the scheduler would allocate it: the publisher sees the taint dropped and leaves the
// unhealthy instance's placement out, as the node did before taints.
func TestWithoutDeviceTaintsTheUnhealthyPlacementIsLeftOut(t *testing.T) {
	ctx, env := clusterWithout(t, "DRADeviceTaints")
	gpuNode, recorder := eventsOn(t, ctx, env)
	p := startPublisher(t, env, dra.PublisherOptions{Events: recorder})
	gpuNode.Status = xidNode(t)
	p.PublishStatus(gpuNode)
	var want []string
	for _, name := range strings.Fields(devicesOf(gpuNode.Status)) {
		if name != "gpu-0-mig-1g-10gb-0" {
			want = append(want, name)
		}
	}
	waitPublished(t, ctx, env.Client, strings.Join(want, " "))
	if note := waitEvent(t, ctx, env, gpuNode, corev1.EventTypeWarning, dra.ReasonSliceFieldsDropped); !strings.Contains(note, "DRADeviceTaints") {
		t.Errorf("the event says %q; want the gate named", note)
	}
	// An instance marked later leaves as well.
	gpuNode.Status.GPUs[0].Applied.MIGInstances[1].Unhealthy = "Xid 94: contained ECC error"
	p.PublishStatus(gpuNode)
	want = slices.DeleteFunc(want, func(n string) bool { return n == "gpu-0-mig-1g-10gb-1" })
	waitPublished(t, ctx, env.Client, strings.Join(want, " "))
}
