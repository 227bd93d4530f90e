package builders

import (
	"fmt"
	"hash/fnv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
)

// H100 and A100 are product names as NVML reports them.
const (
	H100 = "NVIDIA H100 80GB HBM3"
	A100 = "NVIDIA A100-SXM4-80GB"
)

// Node builds a Node with labels given as key, value pairs.
func Node(name string, kv ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
	for i := 0; i+1 < len(kv); i += 2 {
		n.Labels[kv[i]] = kv[i+1]
	}
	return n
}

// GPUNodeOption changes a GPUNode under construction.
type GPUNodeOption func(*v1.GPUNode)

// GPUNode builds a GPUNode as an agent publishes it.
func GPUNode(name string, opts ...GPUNodeOption) *v1.GPUNode {
	gn := &v1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 1}}
	for _, o := range opts {
		o(gn)
	}
	return gn
}

// WithGPUs sets the agent's inventory.
func WithGPUs(gpus ...v1.GPUStatus) GPUNodeOption {
	return func(gn *v1.GPUNode) {
		gn.Status.GPUs = gpus
		gn.Status.GPUCount = int32(len(gpus))
	}
}

// WithSpec sets the desired entries, as the controller would have written them.
func WithSpec(entries ...v1.GPUDesired) GPUNodeOption {
	return func(gn *v1.GPUNode) { gn.Spec.GPUs = entries }
}

// WithObserved sets generation and the agent's observedGeneration.
func WithObserved(generation, observed int64) GPUNodeOption {
	return func(gn *v1.GPUNode) { gn.Generation, gn.Status.ObservedGeneration = generation, observed }
}

// GPUs builds count GPUs of one product for a node, indices 0..count-1.
func GPUs(node string, count int, product string) []v1.GPUStatus {
	out := make([]v1.GPUStatus, count)
	for i := range out {
		out[i] = GPU(node, int32(i), WithProduct(product))
	}
	return out
}

// GPUOption changes a GPU under construction.
type GPUOption func(*v1.GPUStatus)

// GPU builds one GPU of a node; its UUID is derived from node and index so tests can name it.
func GPU(node string, index int32, opts ...GPUOption) v1.GPUStatus {
	g := v1.GPUStatus{UUID: UUID(node, index), Index: index, Product: H100, MIGCapable: true}
	for _, o := range opts {
		o(&g)
	}
	return g
}

// UUID is the stable, well-formed UUID the builders give GPU index of node.
func UUID(node string, index int32) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(node))
	return fmt.Sprintf("GPU-%08x-0000-4000-8000-%012x", h.Sum32(), index)
}

// WithProduct sets the product name.
func WithProduct(p string) GPUOption { return func(g *v1.GPUStatus) { g.Product = p } }

// WithApplied reports sharing in force, from policy, with the Applied condition True.
func WithApplied(s v1.Sharing, policy string) GPUOption {
	return func(g *v1.GPUStatus) {
		g.Applied = AppliedFor(s, policy)
		SetCondition(g, v1.ConditionApplied, metav1.ConditionTrue, v1.ReasonAsDesired, "as desired")
	}
}

// WithCondition sets one of the GPU's conditions.
func WithCondition(t string, status metav1.ConditionStatus, reason, msg string) GPUOption {
	return func(g *v1.GPUStatus) { SetCondition(g, t, status, reason, msg) }
}

// SetCondition sets a GPU condition the way an agent does.
func SetCondition(g *v1.GPUStatus, t string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&g.Conditions, metav1.Condition{Type: t, Status: status, Reason: reason, Message: msg})
}

// AppliedFor is what an agent reports once s is in force: the strategy, the MIG instances it made and the
// hash of s.
func AppliedFor(s v1.Sharing, policy string) *v1.AppliedSharing {
	a := &v1.AppliedSharing{Strategy: s.Strategy, Policy: policy, SpecHash: v1.SharingHash(s)}
	if s.MIG != nil {
		start := int32(0)
		for _, in := range s.MIG.Instances {
			for i := int32(0); i < in.Count; i++ {
				a.MIGInstances = append(a.MIGInstances, v1.MIGInstanceStatus{Profile: in.Profile, Placement: v1.MIGPlacement{Start: start, Size: 1}})
				start++
			}
		}
	}
	if s.TimeSlicing != nil {
		a.TimeSlicing = s.TimeSlicing.DeepCopy()
	}
	if s.Oversubscription != nil {
		// The agent reports the shim's scheduler only while it runs, with the settings it enforces.
		a.Shim = &v1.ShimStatus{TimeQuantum: s.Oversubscription.TimeQuantum, AntiThrashing: s.Oversubscription.AntiThrashing}
	}
	if s.Sizing.PerClaim() {
		a.Sizing = s.Sizing.DeepCopy()
	}
	return a
}

// Desired is a spec entry for GPU index of node from policy.
func Desired(node string, index int32, policy string, generation int64, s v1.Sharing) v1.GPUDesired {
	return v1.GPUDesired{UUID: UUID(node, index), Index: index, Policy: policy, PolicyGeneration: generation, Sharing: s}
}
