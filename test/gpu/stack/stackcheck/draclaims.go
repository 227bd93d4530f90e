package main

import (
	"context"
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/dra"
)

// The scheduler's part of DRA, done by hand: the GPU machine runs no kube-scheduler, so a sized claim's
// allocation is written as the scheduler writes it, from the device the node's ResourceSlice publishes.

// sizedRequest is the request name of every sized claim here.
const sizedRequest = "gpu"

// sizedDevice is the device of a GPU sized per claim, as the node's ResourceSlices publish it.
type sizedDevice struct {
	pool string
	dev  resourcev1.Device
}

// nodeSlices lists the gpusharing ResourceSlices of node, selected by driver and node (slice names are
// the agent's to choose).
func nodeSlices(ctx context.Context, c client.Client, node string) ([]resourcev1.ResourceSlice, error) {
	var list resourcev1.ResourceSliceList
	err := c.List(ctx, &list, client.MatchingFields{resourcev1.ResourceSliceSelectorNodeName: node, resourcev1.ResourceSliceSelectorDriver: dra.DriverName})
	return list.Items, err
}

// findSizedDevice finds the device that shares the GPU of index per claim among a node's slices: in
// the pool's newest generation, only once all of its slices are there (the scheduler uses nothing
// else), the device whose attributes say share Sized and this index. ok is false when there is none.
func findSizedDevice(slices []resourcev1.ResourceSlice, node string, index int) (d sizedDevice, ok bool, err error) {
	var newest int64 = -1
	for _, s := range slices {
		if s.Spec.Driver == dra.DriverName && s.Spec.NodeName != nil && *s.Spec.NodeName == node {
			newest = max(newest, s.Spec.Pool.Generation)
		}
	}
	var count, want int64
	for _, s := range slices {
		if s.Spec.Driver != dra.DriverName || s.Spec.NodeName == nil || *s.Spec.NodeName != node || s.Spec.Pool.Generation != newest {
			continue
		}
		count, want = count+1, s.Spec.Pool.ResourceSliceCount
		for _, dev := range s.Spec.Devices {
			if attrString(dev, dra.AttrShare) != dra.ShareSized || attrInt(dev, dra.AttrIndex) != int64(index) {
				continue
			}
			if ok {
				return d, false, fmt.Errorf("two sized devices of GPU %d in pool %s: %s and %s", index, s.Spec.Pool.Name, d.dev.Name, dev.Name)
			}
			d, ok = sizedDevice{pool: s.Spec.Pool.Name, dev: dev}, true
		}
	}
	if count != want {
		// A pool being rewritten: the scheduler waits for all of its slices too.
		return sizedDevice{}, false, nil
	}
	return d, ok, nil
}

func attrString(d resourcev1.Device, name string) string {
	if a, ok := d.Attributes[resourcev1.QualifiedName(name)]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}

func attrInt(d resourcev1.Device, name string) int64 {
	if a, ok := d.Attributes[resourcev1.QualifiedName(name)]; ok && a.IntValue != nil {
		return *a.IntValue
	}
	return -1
}

// errDoesNotFit: a request past the device's capacity; the scheduler would not allocate it.
var errDoesNotFit = errors.New("request does not fit the device")

// consumedCapacity is what the scheduler records a request consumes of a device with consumable
// capacity (KEP-5075): every capacity of the device, the request's amount or, where it asks none, the
// request policy's default (the whole capacity without one); an amount below the valid range's
// minimum is raised to it, and one off the step grid rounded up to it (3500Mi in 1Gi steps is 4Gi).
// Only valid ranges are handled: the agent's sized devices publish nothing else.
func consumedCapacity(dev resourcev1.Device, requests map[resourcev1.QualifiedName]resource.Quantity) (map[resourcev1.QualifiedName]resource.Quantity, error) {
	for name := range requests {
		if _, ok := dev.Capacity[name]; !ok {
			return nil, fmt.Errorf("%w: %s has no capacity %s", errDoesNotFit, dev.Name, name)
		}
	}
	out := map[resourcev1.QualifiedName]resource.Quantity{}
	for name, c := range dev.Capacity {
		req, asked := requests[name]
		p := c.RequestPolicy
		var v resource.Quantity
		switch {
		case !asked && p != nil && p.Default != nil:
			v = p.Default.DeepCopy()
		case !asked:
			v = c.Value.DeepCopy()
		case p == nil:
			v = req.DeepCopy()
		case len(p.ValidValues) > 0:
			return nil, fmt.Errorf("%s: capacity %s has valid values, not handled here", dev.Name, name)
		case p.ValidRange != nil && p.ValidRange.Min != nil:
			v = roundUpToRange(req, *p.ValidRange)
		default:
			v = req.DeepCopy()
		}
		if v.Cmp(c.Value) > 0 || (p != nil && p.ValidRange != nil && p.ValidRange.Max != nil && v.Cmp(*p.ValidRange.Max) > 0) {
			return nil, fmt.Errorf("%w: %s %s of %s (capacity %s)", errDoesNotFit, name, v.String(), dev.Name, c.Value.String())
		}
		out[name] = v
	}
	return out, nil
}

func roundUpToRange(req resource.Quantity, r resourcev1.CapacityRequestPolicyRange) resource.Quantity {
	if req.Cmp(*r.Min) < 0 {
		return r.Min.DeepCopy()
	}
	if r.Step == nil || r.Step.Value() <= 0 {
		return req.DeepCopy()
	}
	minimum, step := r.Min.Value(), r.Step.Value()
	n := (req.Value() - minimum + step - 1) / step
	return *resource.NewQuantity(minimum+n*step, resource.BinarySI)
}

// claimPod creates a pod bound to node whose one container uses a ResourceClaim of the same name, and
// the claim: class gpusharing-sized, asking for memory and compute.
func claimPod(ctx context.Context, c client.Client, node, name string, memory, compute resource.Quantity) (*corev1.Pod, *resourcev1.ResourceClaim, error) {
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: podNamespace, Name: name},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: sizedRequest,
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpusharing-sized", Capacity: &resourcev1.CapacityRequirements{
				Requests: map[resourcev1.QualifiedName]resource.Quantity{dra.CapacityMemory: memory, dra.CapacityCompute: compute}}}}}}}}
	if err := c.Create(ctx, claim); err != nil {
		return nil, nil, fmt.Errorf("creating claim %s: %w", name, err)
	}
	claimName := name
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: podNamespace, Name: name},
		Spec: corev1.PodSpec{NodeName: node,
			ResourceClaims: []corev1.PodResourceClaim{{Name: sizedRequest, ResourceClaimName: &claimName}},
			Containers: []corev1.Container{{Name: "main", Image: "local/cuda-workload:1",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: sizedRequest}}}}}}}
	if err := c.Create(ctx, pod); err != nil {
		return nil, claim, fmt.Errorf("creating pod %s: %w", name, err)
	}
	return pod, claim, nil
}

// sizedAllocation is the allocation kube-scheduler writes for a claim of one request on a sized
// device: one result with a share id of its own and what the request consumes, and the node selector of
// a node-local device.
func sizedAllocation(d sizedDevice, node string, consumed map[resourcev1.QualifiedName]resource.Quantity) *resourcev1.AllocationResult {
	share := uuid.NewUUID()
	now := metav1.Now()
	return &resourcev1.AllocationResult{
		Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{{
			Request: sizedRequest, Driver: dra.DriverName, Pool: d.pool, Device: d.dev.Name, ShareID: &share, ConsumedCapacity: consumed}}},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
			{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}},
		AllocationTimestamp: &now,
	}
}

// allocate writes claim's allocation on d, reserved for pod, as the scheduler does when it binds the
// pod, and returns what the claim consumes.
func allocate(ctx context.Context, c client.Client, claim *resourcev1.ResourceClaim, pod *corev1.Pod, d sizedDevice, node string) (map[resourcev1.QualifiedName]resource.Quantity, error) {
	var requests map[resourcev1.QualifiedName]resource.Quantity
	for _, r := range claim.Spec.Devices.Requests {
		if r.Name == sizedRequest && r.Exactly != nil && r.Exactly.Capacity != nil {
			requests = r.Exactly.Capacity.Requests
		}
	}
	consumed, err := consumedCapacity(d.dev, requests)
	if err != nil {
		return nil, err
	}
	claim.Status.Allocation = sizedAllocation(d, node, consumed)
	claim.Status.ReservedFor = []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	if err := c.Status().Update(ctx, claim); err != nil {
		return nil, fmt.Errorf("writing the allocation of claim %s: %w", claim.Name, err)
	}
	return consumed, nil
}

// deleteClaimPods deletes the pods at once (no kubelet here ends a terminating pod) and their claims.
func deleteClaimPods(ctx context.Context, c client.Client, names []string) error {
	var errs []error
	for _, n := range slices.Compact(slices.Sorted(slices.Values(names))) {
		key := metav1.ObjectMeta{Namespace: podNamespace, Name: n}
		if err := c.Delete(ctx, &corev1.Pod{ObjectMeta: key}, client.GracePeriodSeconds(0)); client.IgnoreNotFound(err) != nil {
			errs = append(errs, err)
		}
		if err := c.Delete(ctx, &resourcev1.ResourceClaim{ObjectMeta: key}); client.IgnoreNotFound(err) != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
