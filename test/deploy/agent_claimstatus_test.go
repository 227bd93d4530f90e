package deploy

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// otherDriver is a driver beside the agent's on the same claim.
const otherDriver = "nic.example.com"

// allocatedClaim creates a claim in ns allocated on node: one device of the agent's driver and one of
// otherDriver, as the kube-scheduler writes it (an admin here, which holds resourceclaims/binding).
func allocatedClaim(t *testing.T, ctx context.Context, ns, name, node string) *resourcev1.ResourceClaim {
	t.Helper()
	c := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{
			{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu.gpusharing.io"}},
			{Name: "nic", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "nic.example.com"}},
		}}},
	}
	if err := env.Client.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	c.Status.Allocation = &resourcev1.AllocationResult{
		Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{
			{Request: "gpu", Driver: driver, Pool: node, Device: "gpu-0"},
			{Request: "nic", Driver: otherDriver, Pool: node, Device: "nic-0"},
		}},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
		}}},
	}
	if err := env.Client.Status().Update(ctx, c); err != nil {
		t.Fatal(err)
	}
	return c
}

// deviceStatus is the status of one allocated device of c, with the usage the agent writes.
func deviceStatus(c *resourcev1.ResourceClaim, drv string) resourcev1.AllocatedDeviceStatus {
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == drv {
			return resourcev1.AllocatedDeviceStatus{Driver: r.Driver, Pool: r.Pool, Device: r.Device,
				Data: &runtime.RawExtension{Raw: []byte(`{"heldBytes":1048576}`)}}
		}
	}
	panic("no device of driver " + drv)
}

// patchStatus patches c's status as cl, after change.
func patchStatus(ctx context.Context, cl client.Client, c *resourcev1.ResourceClaim, change func(*resourcev1.ResourceClaim)) error {
	to := c.DeepCopy()
	change(to)
	return cl.Status().Patch(ctx, to, client.MergeFrom(c))
}

// The agent's claim rights (resourceclaims/status patch, resourceclaims/driver associated-node:patch
// named for its driver) reach what its device status needs and no further: Kubernetes 1.36 authorizes a
// change of status.devices per driver, from a token bound to the node the claim is allocated on, and a
// change of status.allocation or status.reservedFor only with resourceclaims/binding, which the agent
// does not hold. So a stolen agent token can neither write usage into another node's claims nor another
// driver's entries, nor take a claim from its pods or give it to others.
func TestAgentOfOneNodeWritesOnlyItsOwnDevicesStatusOfItsNodesClaims(t *testing.T) {
	install(t)
	ctx := context.Background()
	ns := "claimstatus-probe"
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	nodeA, nodeB := "claimstatus-node-a", "claimstatus-node-b"
	onA := allocatedClaim(t, ctx, ns, "on-a", nodeA)
	onB := allocatedClaim(t, ctx, ns, "on-b", nodeB)
	agentA := agentClient(t, nodeA)
	devices := `resource="resourceclaims/driver"`
	for _, tc := range []struct {
		name   string
		write  func() error
		saying string
	}{
		{"device status of a claim allocated on another node", func() error {
			return patchStatus(ctx, agentA, onB, func(c *resourcev1.ResourceClaim) {
				c.Status.Devices = []resourcev1.AllocatedDeviceStatus{deviceStatus(onB, driver)}
			})
		}, devices},
		{"device status of another driver on its node's claim", func() error {
			return patchStatus(ctx, agentA, onA, func(c *resourcev1.ResourceClaim) {
				c.Status.Devices = []resourcev1.AllocatedDeviceStatus{deviceStatus(onA, otherDriver)}
			})
		}, devices},
		{"the pods its node's claim is reserved for", func() error {
			return patchStatus(ctx, agentA, onA, func(c *resourcev1.ResourceClaim) {
				c.Status.ReservedFor = []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: "intruder", UID: "0000-intruder"}}
			})
		}, `resource="resourceclaims/binding"`},
		{"the allocation of its node's claim", func() error {
			return patchStatus(ctx, agentA, onA, func(c *resourcev1.ResourceClaim) { c.Status.Allocation = nil })
		}, `resource="resourceclaims/binding"`},
		{"device status with a token bound to no node", func() error {
			return patchStatus(ctx, agentClient(t, ""), onA, func(c *resourcev1.ResourceClaim) {
				c.Status.Devices = []resourcev1.AllocatedDeviceStatus{deviceStatus(onA, driver)}
			})
		}, devices},
	} {
		t.Run(tc.name, func(t *testing.T) { refusedSaying(t, tc.name, tc.write(), tc.saying) })
	}

	if err := patchStatus(ctx, agentA, onA, func(c *resourcev1.ResourceClaim) {
		c.Status.Devices = []resourcev1.AllocatedDeviceStatus{deviceStatus(onA, driver)}
	}); err != nil {
		t.Fatalf("the agent of node a could not write its device's status into a claim allocated on node a: %v", err)
	}
	got := &resourcev1.ResourceClaim{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(onA), got); err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Devices) != 1 || got.Status.Devices[0].Driver != driver || got.Status.Allocation == nil {
		t.Errorf("claim on node a after the agent's write: devices %+v, allocation %v", got.Status.Devices, got.Status.Allocation)
	}
}
