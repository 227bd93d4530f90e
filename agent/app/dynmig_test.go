package app

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/api/meta"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// A GPU whose policy lets claims create MIG instances enters MIG mode, publishes its placements, and a
// claim the scheduler allocated one of them is prepared with an instance created there, which the
// GPUNode lists with the claim and its pod; unpreparing destroys it.
func TestAgentCreatesADynamicMIGInstanceForAClaimAndListsIt(t *testing.T) {
	ctx := context.Background()
	n, plugin := startDRANode(t, nil)
	gpuUUID := n.uuid(0)
	// The A100-SXM4-40GB: 3g.20gb sits at memory slices 0-3 or 4-7.
	dyn := v1alpha1.Sharing{Strategy: v1alpha1.StrategyMIG, MIG: &v1alpha1.MIGSharing{Dynamic: &v1alpha1.DynamicMIG{Profiles: []string{"1g.5gb", "3g.20gb"}}}}
	n.setSpec(t, v1alpha1.GPUDesired{UUID: gpuUUID, Index: 0, Sharing: dyn})
	n.waitFor(t, "dynamic MIG applied", appliedAsDesired(gpuUUID))
	waitSlices(t, n.name, "gpu-0-mig-1g-5gb-0 gpu-0-mig-1g-5gb-1 gpu-0-mig-1g-5gb-2 gpu-0-mig-1g-5gb-3 gpu-0-mig-1g-5gb-4 gpu-0-mig-1g-5gb-5 gpu-0-mig-1g-5gb-6 gpu-0-mig-3g-20gb-0 gpu-0-mig-3g-20gb-4")

	pod := runningPod(t, "dyn-"+n.name, nil)
	claim := dynClaim(t, ctx, n.name, "dyn-"+n.name, "gpu-0-mig-3g-20gb-4", pod)
	kubelet := pluginClient(t, plugin.PluginDir)
	ref := prepareAsKubelet(t, ctx, kubelet, claim)

	n.waitFor(t, "the instance listed with its claim and pod", func(g *v1alpha1.GPUNode) (bool, string) {
		a := gpuState(g, gpuUUID).Applied
		if a == nil || a.MIGDynamic == nil || len(a.MIGInstances) != 1 {
			return false, fmt.Sprintf("applied %+v", a)
		}
		in := a.MIGInstances[0]
		ok := in.Profile == "3g.20gb" && in.Placement.Start == 4 && in.Claim != nil && in.Claim.Name == claim.Name &&
			len(in.Claim.Pods) == 1 && in.Claim.Pods[0] == pod.Name && strings.HasPrefix(in.UUID, "MIG-") &&
			a.MIGDynamic.FreeSlices == "0-3" && a.MIGDynamic.FreeComputeSlices == 4 && g.Status.MIGFree == "0:slices 0-3 compute 4"
		return ok, fmt.Sprintf("instance %+v claim %+v dynamic %+v migFree %q summary %q", in, in.Claim, a.MIGDynamic, g.Status.MIGFree, g.Status.Summary)
	})
	// An instance created for a claim is not a layout change: another pass drains nothing.
	n.reconciled(t)
	if g := gpuState(n.get(t), gpuUUID); g.Drain != nil || len(g.Applied.MIGInstances) != 1 {
		t.Fatalf("after another pass: drain %+v, instances %+v", g.Drain, g.Applied.MIGInstances)
	}
	// The placements stay published: the claim's allocation holds its counters, not a missing device.
	waitSlices(t, n.name, "gpu-0-mig-1g-5gb-0 gpu-0-mig-1g-5gb-1 gpu-0-mig-1g-5gb-2 gpu-0-mig-1g-5gb-3 gpu-0-mig-1g-5gb-4 gpu-0-mig-1g-5gb-5 gpu-0-mig-1g-5gb-6 gpu-0-mig-3g-20gb-0 gpu-0-mig-3g-20gb-4")

	// A critical Xid on the claim's instance marks that instance alone: the GPU stays healthy, its other
	// placements stay published, the instance's own placement is tainted NoSchedule while it lives.
	in := gpuState(n.get(t), gpuUUID).Applied.MIGInstances[0]
	if got := n.events.Push(0, nvml.EventTypeXidCriticalError, 94, uint32(in.GPUInstanceID), uint32(in.ComputeInstanceID)); got != 1 {
		t.Fatalf("the Xid reached %d event sets", got)
	}
	n.waitFor(t, "the instance marked alone", func(g *v1alpha1.GPUNode) (bool, string) {
		st := gpuState(g, gpuUUID)
		ins := st.Applied.MIGInstances
		healthy := meta.IsStatusConditionTrue(st.Conditions, v1alpha1.ConditionHealthy)
		return healthy && len(ins) == 1 && strings.Contains(ins[0].Unhealthy, "Xid 94") && strings.Contains(ins[0].Unhealthy, "only this instance is marked"),
			fmt.Sprintf("healthy %v instances %+v", healthy, ins)
	})
	waitSlices(t, n.name, "gpu-0-mig-1g-5gb-0 gpu-0-mig-1g-5gb-1 gpu-0-mig-1g-5gb-2 gpu-0-mig-1g-5gb-3 gpu-0-mig-1g-5gb-4 gpu-0-mig-1g-5gb-5 gpu-0-mig-1g-5gb-6 gpu-0-mig-3g-20gb-0 gpu-0-mig-3g-20gb-4[gpu.gpusharing.io/unhealthy=Xid-94:NoSchedule]")

	if _, err := kubelet.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{ref}}); err != nil {
		t.Fatal(err)
	}
	n.waitFor(t, "the instance destroyed", func(g *v1alpha1.GPUNode) (bool, string) {
		a := gpuState(g, gpuUUID).Applied
		return a != nil && a.MIGDynamic != nil && len(a.MIGInstances) == 0 && a.MIGDynamic.FreeSlices == "0-7",
			fmt.Sprintf("applied %+v", a)
	})
	// The mark ended with the instance: the placement is offered again, untainted.
	waitSlices(t, n.name, "gpu-0-mig-1g-5gb-0 gpu-0-mig-1g-5gb-1 gpu-0-mig-1g-5gb-2 gpu-0-mig-1g-5gb-3 gpu-0-mig-1g-5gb-4 gpu-0-mig-1g-5gb-5 gpu-0-mig-1g-5gb-6 gpu-0-mig-3g-20gb-0 gpu-0-mig-3g-20gb-4")
}
