// Package builders makes API objects for the controllers' tests and benchmark, with functional options
// so each test states only what matters to it.
package builders

import (
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
)

// PolicyOption changes a policy under construction.
type PolicyOption func(*v1.GPUSharingPolicy)

// Policy builds a GPUSharingPolicy; without options it shares every GPU of every node Exclusive.
func Policy(name string, opts ...PolicyOption) *v1.GPUSharingPolicy {
	p := &v1.GPUSharingPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 1},
		Spec:       v1.GPUSharingPolicySpec{Sharing: Exclusive()},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

// WithPriority sets spec.priority.
func WithPriority(n int32) PolicyOption { return func(p *v1.GPUSharingPolicy) { p.Spec.Priority = n } }

// WithNodeLabels selects nodes carrying every one of the labels (key, value pairs).
func WithNodeLabels(kv ...string) PolicyOption {
	return func(p *v1.GPUSharingPolicy) {
		sel := &v1.NodeSelector{MatchLabels: map[string]v1.LabelValue{}}
		for i := 0; i+1 < len(kv); i += 2 {
			sel.MatchLabels[kv[i]] = v1.LabelValue(kv[i+1])
		}
		p.Spec.NodeSelector = sel
	}
}

// WithProducts selects GPUs by product name.
func WithProducts(products ...string) PolicyOption {
	return func(p *v1.GPUSharingPolicy) { p.Spec.GPUs = &v1.GPUSelector{Products: products} }
}

// WithIndices selects GPUs by NVML index.
func WithIndices(indices ...int32) PolicyOption {
	return func(p *v1.GPUSharingPolicy) { p.Spec.GPUs = &v1.GPUSelector{Indices: indices} }
}

// WithUUIDs selects GPUs by UUID.
func WithUUIDs(uuids ...string) PolicyOption {
	return func(p *v1.GPUSharingPolicy) { p.Spec.GPUs = &v1.GPUSelector{UUIDs: uuids} }
}

// WithSharing sets spec.sharing.
func WithSharing(s v1.Sharing) PolicyOption {
	return func(p *v1.GPUSharingPolicy) { p.Spec.Sharing = s }
}

// WithMaxUnavailable sets spec.rollout.maxUnavailable, a count or a percentage such as "25%".
func WithMaxUnavailable(v intstr.IntOrString) PolicyOption {
	return func(p *v1.GPUSharingPolicy) { p.Spec.Rollout.MaxUnavailable = &v }
}

// WithCreated sets the creation time, which breaks ties between policies of equal priority.
func WithCreated(t time.Time) PolicyOption {
	return func(p *v1.GPUSharingPolicy) { p.CreationTimestamp = metav1.NewTime(t) }
}

// WithGeneration sets metadata.generation (the API server sets it on real objects).
func WithGeneration(g int64) PolicyOption { return func(p *v1.GPUSharingPolicy) { p.Generation = g } }

// Exclusive is the whole GPU for one pod.
func Exclusive() v1.Sharing { return v1.Sharing{Strategy: v1.StrategyExclusive} }

// MPS shares the GPU between replicas MPS clients, with an optional thread percentage (0: omitted).
func MPS(replicas, threads int32) v1.Sharing {
	s := v1.Sharing{Strategy: v1.StrategyMPS, MPS: &v1.MPSSharing{Replicas: replicas}}
	if threads > 0 {
		s.MPS.ActiveThreadPercentage = &threads
	}
	return s
}

// MPSWithMemory is MPS with a pinned memory limit per client.
func MPSWithMemory(replicas int32, limit string) v1.Sharing {
	s := MPS(replicas, 0)
	q := resource.MustParse(limit)
	s.MPS.PinnedMemoryLimit = &q
	return s
}

// TimeSlicing shares the GPU between replicas pods with the given interval.
func TimeSlicing(replicas int32, interval v1.TimeSliceInterval) v1.Sharing {
	return v1.Sharing{Strategy: v1.StrategyTimeSlicing, TimeSlicing: &v1.TimeSlicingSharing{Replicas: replicas, Interval: interval}}
}

// MIG partitions the GPU; pairs are profile and count, for example MIG("3g.40gb", 2).
func MIG(pairs ...any) v1.Sharing {
	m := &v1.MIGSharing{}
	for i := 0; i+1 < len(pairs); i += 2 {
		m.Instances = append(m.Instances, v1.MIGInstanceRequest{Profile: pairs[i].(string), Count: int32(pairs[i+1].(int))})
	}
	return v1.Sharing{Strategy: v1.StrategyMIG, MIG: m}
}
