package app

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// preparedClaim is a 10Gi, 30% claim of a simulated 40 GiB GPU sized per claim, prepared through the
// agent's kubelet plugin for a pod whose process (pid) the accounting names.
type preparedClaim struct {
	n        *testNode
	procRoot string
	gpu      string
	pid      uint32
	pod      *corev1.Pod
	claim    *resourcev1.ResourceClaim
	kubelet  drapb.DRAPluginClient
	ref      *drapb.Claim
}

// prepareSizedClaim runs an agent with DRA and the accounting (every 100 ms), sizes its GPU per claim
// with sizing, and prepares the claim as the kubelet would; then the pod's process uses 3 GiB.
func prepareSizedClaim(t *testing.T, sizing v1alpha1.Sizing) preparedClaim {
	t.Helper()
	ctx := context.Background()
	procRoot := t.TempDir()
	n, plugin := startDRANode(t, func(o *Options) {
		o.ProcRoot = procRoot
		o.Accounting = &AccountingOptions{Interval: 100 * time.Millisecond}
	})
	gpuUUID := n.uuid(0)
	sized := v1alpha1.Sharing{Strategy: v1alpha1.StrategyMPS, MPS: &v1alpha1.MPSSharing{Replicas: 2}, Sizing: &sizing}
	n.setSpec(t, v1alpha1.GPUDesired{UUID: gpuUUID, Index: 0, Sharing: sized})
	n.waitFor(t, "sized shares applied", appliedAsDesired(gpuUUID))
	waitSlices(t, n.name, "gpu-0-sized")

	const pid = 4343
	pod := accountedPod(t, "sized-"+n.name, n.name, procRoot, pid)

	// The scheduler's work, written as it writes it: a 10Gi, 30% share of the sized device, reserved for the pod.
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: "sized-" + n.name},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpu",
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpusharing-sized"}}}}}}
	if err := env.Client.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), claim) })
	share := uuid.NewUUID()
	claim.Status.Allocation = &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{
		Results: []resourcev1.DeviceRequestAllocationResult{{Request: "gpu", Driver: dra.DriverName, Pool: n.name, Device: "gpu-0-sized", ShareID: &share,
			ConsumedCapacity: map[resourcev1.QualifiedName]resource.Quantity{dra.CapacityMemory: resource.MustParse("10Gi"), dra.CapacityCompute: resource.MustParse("30")}}}}}
	claim.Status.ReservedFor = []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	if err := env.Client.Status().Update(ctx, claim); err != nil {
		t.Fatal(err)
	}
	kubelet := pluginClient(t, plugin.PluginDir)
	ref := prepareAsKubelet(t, ctx, kubelet, claim)
	// The pod's process uses the GPU only now, as on a node: the kubelet starts a pod's containers after
	// its claims are prepared (a pod using the GPU without a claim is over its claims).
	n.gpus.GPUs[0].SetUsage(nvmlmock.Proc(pid, 3<<30, 40))
	return preparedClaim{n: n, procRoot: procRoot, gpu: gpuUUID, pid: pid, pod: pod, claim: claim, kubelet: kubelet, ref: ref}
}

// A GPU sized per claim lists in its status what the prepared claims were allocated, each claim with
// its pod and the memory the pod uses, and the wide column shows the allocated memory; unpreparing the
// claim empties both.
func TestAgentListsTheSizedClaimsOfAGPUWithTheirPodsUse(t *testing.T) {
	ctx := context.Background()
	pc := prepareSizedClaim(t, v1alpha1.Sizing{Mode: v1alpha1.SizingPerClaim})
	n, gpuUUID, claim, pod, kubelet, ref := pc.n, pc.gpu, pc.claim, pc.pod, pc.kubelet, pc.ref
	n.waitFor(t, "the sized GPU lists the claim with its pod's use", func(g *v1alpha1.GPUNode) (bool, string) {
		s := gpuState(g, gpuUUID).Sized
		if s == nil || len(s.Claims) != 1 {
			return false, fmt.Sprintf("sized %+v", s)
		}
		c := s.Claims[0]
		ok := s.MemoryAllocated.Value() == 10<<30 && s.ComputeAllocated == 30 && c.Name == claim.Name && c.Namespace == claim.Namespace &&
			len(c.Pods) == 1 && c.Pods[0] == pod.Name && c.Memory.Value() == 10<<30 && c.Compute == 30 &&
			c.MemoryUsed != nil && c.MemoryUsed.Value() == 3<<30 && g.Status.MemoryAllocated == "0:10Gi/40Gi"
		return ok, fmt.Sprintf("sized %+v claim %+v memoryAllocated %q", s, c, g.Status.MemoryAllocated)
	})

	if _, err := kubelet.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{ref}}); err != nil {
		t.Fatal(err)
	}
	n.waitFor(t, "the claim leaves the status", func(g *v1alpha1.GPUNode) (bool, string) {
		s := gpuState(g, gpuUUID).Sized
		return s != nil && len(s.Claims) == 0 && s.MemoryAllocated.Value() == 0 && g.Status.MemoryAllocated == "0:0/40Gi",
			fmt.Sprintf("sized %+v memoryAllocated %q", s, g.Status.MemoryAllocated)
	})
}
