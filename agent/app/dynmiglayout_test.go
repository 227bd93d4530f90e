package app

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// dynClaim creates a claim allocated the placement device and reserved for pod, as the scheduler
// writes it.
func dynClaim(t *testing.T, ctx context.Context, node, name, device string, pod *corev1.Pod) *resourcev1.ResourceClaim {
	t.Helper()
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: name},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpu",
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpusharing-mig-dynamic"}}}}}}
	if err := env.Client.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), claim) })
	claim.Status.Allocation = &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{
		Results: []resourcev1.DeviceRequestAllocationResult{{Request: "gpu", Driver: dra.DriverName, Pool: node, Device: device}}}}
	claim.Status.ReservedFor = []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	if err := env.Client.Status().Update(ctx, claim); err != nil {
		t.Fatal(err)
	}
	return claim
}

// A fixed 3g.20gb added to a dynamic A100 whose claims hold 2g.10gb at 0-1 (claim a) and 1g.5gb at 6
// (claim b) fits around neither: the agent drains claim a's pod alone and says why, claim b's pod and
// instance stay, the placements clear of the change stay published, and once claim a's pod is gone the
// 3g.20gb is created at 0-3 beside claim b's untouched instance.
func TestAFixedLayoutChangeDrainsOnlyTheClaimWhosePlacementItNeeds(t *testing.T) {
	ctx := context.Background()
	n, plugin := startDRANode(t, nil)
	gpuUUID := n.uuid(0)
	profiles := []string{"1g.5gb", "2g.10gb"}
	dyn := func(fixed ...v1alpha1.MIGInstanceRequest) v1alpha1.GPUDesired {
		return v1alpha1.GPUDesired{UUID: gpuUUID, Index: 0, Drain: drainSpec(v1alpha1.DrainWaitForIdle, time.Minute),
			Sharing: v1alpha1.Sharing{Strategy: v1alpha1.StrategyMIG, MIG: &v1alpha1.MIGSharing{Instances: fixed, Dynamic: &v1alpha1.DynamicMIG{Profiles: profiles}}}}
	}
	n.setSpec(t, dyn())
	n.waitFor(t, "dynamic MIG applied", appliedAsDesired(gpuUUID))

	podA := runningPod(t, "layout-a-"+n.name, nil)
	podB := runningPod(t, "layout-b-"+n.name, nil)
	claimA := dynClaim(t, ctx, n.name, "layout-a-"+n.name, "gpu-0-mig-2g-10gb-0", podA)
	claimB := dynClaim(t, ctx, n.name, "layout-b-"+n.name, "gpu-0-mig-1g-5gb-6", podB)
	kubelet := pluginClient(t, plugin.PluginDir)
	refA := prepareAsKubelet(t, ctx, kubelet, claimA)
	prepareAsKubelet(t, ctx, kubelet, claimB)
	var instB v1alpha1.MIGInstanceStatus
	n.waitFor(t, "both claims' instances listed", func(g *v1alpha1.GPUNode) (bool, string) {
		a := gpuState(g, gpuUUID).Applied
		if a == nil || len(a.MIGInstances) != 2 {
			return false, fmt.Sprintf("applied %+v", a)
		}
		for _, in := range a.MIGInstances {
			if in.Claim != nil && in.Claim.Name == claimB.Name {
				instB = in
			}
		}
		return instB.UUID != "", fmt.Sprintf("instances %+v", a.MIGInstances)
	})

	n.setSpec(t, dyn(v1alpha1.MIGInstanceRequest{Profile: "3g.20gb", Count: 1}))
	n.waitFor(t, "the drain of claim a's pod alone", func(g *v1alpha1.GPUNode) (bool, string) {
		d := gpuState(g, gpuUUID).Drain
		if d == nil {
			return false, "no drain"
		}
		return d.Phase == v1alpha1.DrainPhaseDraining && slices.Equal(d.Pods, []string{podA.Namespace + "/" + podA.Name}) &&
				strings.Contains(d.Message, "drains only claim "+claimA.Namespace+"/"+claimA.Name+" (2g.10gb at 0-1): the new fixed 3g.20gb at 0-3 needs its slices"),
			fmt.Sprintf("drain %+v; applied condition %q", d, conditionMessage(gpuState(g, gpuUUID).Conditions, v1alpha1.ConditionApplied))
	})
	// The placements clear of 0-3 stay published, claim b's own too (its allocation holds its counters).
	waitSlices(t, n.name, "gpu-0-mig-1g-5gb-4 gpu-0-mig-1g-5gb-5 gpu-0-mig-1g-5gb-6 gpu-0-mig-2g-10gb-4")
	n.reconciled(t)
	if d := gpuState(n.get(t), gpuUUID).Drain; d == nil || slices.Contains(d.Pods, podB.Namespace+"/"+podB.Name) {
		t.Fatalf("drain %+v; claim b's pod must not be drained", d)
	}

	// Claim a's pod ends: the kubelet unprepares its claim (the instance goes), then the pod is done.
	if _, err := kubelet.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{refA}}); err != nil {
		t.Fatal(err)
	}
	env.SetPodPhase(t, ctx, podA, corev1.PodSucceeded)
	g := n.waitFor(t, "the 3g.20gb applied beside claim b", appliedAsDesired(gpuUUID))
	st := gpuState(g, gpuUUID)
	var got []string
	for _, in := range st.Applied.MIGInstances {
		got = append(got, fmt.Sprintf("%s@%d claim=%v", in.Profile, in.Placement.Start, in.Claim != nil))
		if in.Claim != nil && (in.UUID != instB.UUID || in.GPUInstanceID != instB.GPUInstanceID) {
			t.Errorf("claim b's instance %+v, want it untouched (%s, GI %d)", in, instB.UUID, instB.GPUInstanceID)
		}
	}
	slices.Sort(got)
	if st.Drain != nil || strings.Join(got, " ") != "1g.5gb@6 claim=true 3g.20gb@0 claim=false" {
		t.Errorf("after the change: drain %+v, instances %v; want the fixed 3g.20gb at 0 and claim b's 1g.5gb at 6", st.Drain, got)
	}
	var b corev1.Pod
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(podB), &b); err != nil || b.Status.Phase != corev1.PodRunning || b.DeletionTimestamp != nil {
		t.Errorf("claim b's pod: phase %s deleting %v, %v; want it running", b.Status.Phase, b.DeletionTimestamp, err)
	}
}
