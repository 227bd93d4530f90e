package app

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/hostpath"
	"github.com/gpusharing/gpusharing/agent/scheduler"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/shimclient"
)

// An allocation the shim's ledger refuses at a sized claim's size is counted in the claim's entry of the
// GPUNode status, with what it would have brought the claim to, and stays counted after the refused
// process leaves (which ends the ledger and its own count).
func TestAnAllocationRefusedAtTheClaimIsCountedInItsStatus(t *testing.T) {
	ctx := context.Background()
	procRoot := t.TempDir()
	n, plugin := startDRANode(t, func(o *Options) { o.ProcRoot = procRoot })
	gpuUUID := n.uuid(0)
	sized := oversubscribedTimeSlicing(2, 3*time.Second, "8Gi")
	sized.Sizing = &v1alpha1.Sizing{Mode: v1alpha1.SizingPerClaim}
	n.setSpec(t, v1alpha1.GPUDesired{UUID: gpuUUID, Index: 0, Sharing: sized})
	n.waitFor(t, "sized shim shares applied", appliedAsDesired(gpuUUID))
	sock := hostpath.SchedulerSocket(filepath.Join(n.dir, "s"), gpuUUID)
	waitSlices(t, n.name, "gpu-0-sized")

	claimName := "trainer-" + n.name
	pod := guardPod(t, "trainer-"+n.name, n.name, claimName)
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: claimName},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpu",
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpusharing-sized"}}}}}}
	if err := env.Client.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), claim) })
	share := uuid.NewUUID()
	claim.Status.Allocation = &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{
		Results: []resourcev1.DeviceRequestAllocationResult{{Request: "gpu", Driver: dra.DriverName, Pool: n.name, Device: "gpu-0-sized", ShareID: &share,
			ConsumedCapacity: map[resourcev1.QualifiedName]resource.Quantity{dra.CapacityMemory: resource.MustParse("2Gi")}}}}}
	claim.Status.ReservedFor = []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	if err := env.Client.Status().Update(ctx, claim); err != nil {
		t.Fatal(err)
	}
	prepareAsKubelet(t, ctx, pluginClient(t, plugin.PluginDir), claim)

	runAs(t, procRoot, pod)
	cl := shimclient.Dial(t, sock, gpuUUID)
	if cl.Ledger.Flags&scheduler.LedgerOn == 0 || cl.Ledger.Claim != 2<<30 {
		t.Fatalf("ledger %+v, want the 2Gi claim's", cl.Ledger)
	}
	cl.Send(scheduler.Message{Type: scheduler.MsgCharge, Seq: 1, Bytes: 3 << 30})
	if m := cl.Expect(scheduler.MsgCharged); m.Charge != scheduler.ChargeRefused {
		t.Fatalf("a charge of 3Gi against a 2Gi claim = %+v, want refused", m)
	}
	_ = cl.Conn.Close() // the process fails its allocation and exits: its ledger goes
	n.waitFor(t, "the refusal in the claim's status", func(g *v1alpha1.GPUNode) (bool, string) {
		st := gpuState(g, gpuUUID)
		if st == nil || st.Sized == nil || len(st.Sized.Claims) != 1 {
			return false, "no sized claim"
		}
		c := st.Sized.Claims[0]
		ok := c.Name == claimName && c.AllocationsRefused == 1 && c.RefusedDemand != nil && c.RefusedDemand.Value() >= 3<<30 &&
			c.LastRefusalTime != nil && st.Applied.Shim != nil && len(st.Applied.Shim.Clients) == 0
		return ok, fmt.Sprintf("claim %+v, shim %+v", c, st.Applied.Shim)
	})
}
