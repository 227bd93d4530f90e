package node

import (
	"cmp"
	"slices"

	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/gpusharing/gpusharing/agent/accounting"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// setPods fills status.pods from the accounting's latest snapshot, keeping what was published where
// the accounting has not read the GPUs (yet, or this time), and remembers it for UsageSampled.
func (r *Reconciler) setPods(st *v1alpha1.GPUNodeStatus) {
	if r.Usage == nil {
		st.Pods, st.OmittedPods = nil, 0
		return
	}
	if snap := r.Usage.Latest(); snap.Err == nil && !snap.At.IsZero() {
		st.Pods, st.OmittedPods = podsStatus(snap, st.Pods)
	}
	r.usage.mu.Lock()
	r.usage.pods = publishedPods{pods: st.Pods, omitted: st.OmittedPods}
	r.usage.mu.Unlock()
}

// publishedPods is status.pods as the last pass published it.
type publishedPods struct {
	pods    []v1alpha1.PodGPUs
	omitted int32
}

// podsChanged says whether the snapshot changes status.pods past the thresholds.
func (p publishedPods) changed(snap accounting.Snapshot) bool {
	pods, omitted := podsStatus(snap, p.pods)
	return omitted != p.omitted || !equality.Semantic.DeepEqual(pods, p.pods)
}

// podsStatus builds status.pods: the pods on two or more GPUs with their figures on each, the pods with
// the most GPUs first, then by namespace and name, at most MaxPodsInStatus, and how many were left out.
// A figure that moved less than its threshold from prev keeps prev's (usageStatus's rule), and a GPU
// the accounting could not read this time keeps prev's entries for it.
func podsStatus(snap accounting.Snapshot, prev []v1alpha1.PodGPUs) ([]v1alpha1.PodGPUs, int32) {
	failed := map[string]bool{}
	read := accounting.Snapshot{At: snap.At}
	for _, g := range snap.GPUs {
		if g.Err != nil {
			failed[g.UUID] = true
		} else {
			read.GPUs = append(read.GPUs, g)
		}
	}
	old := map[string]map[string]v1alpha1.PodGPUUsage{}
	for _, p := range prev {
		byUUID := map[string]v1alpha1.PodGPUUsage{}
		for _, g := range p.GPUs {
			byUUID[g.UUID] = g
		}
		old[p.Namespace+"/"+p.Name] = byUUID
	}
	byPod := map[string]*v1alpha1.PodGPUs{}
	pod := func(namespace, name string) *v1alpha1.PodGPUs {
		k := namespace + "/" + name
		if byPod[k] == nil {
			byPod[k] = &v1alpha1.PodGPUs{Namespace: namespace, Name: name}
		}
		return byPod[k]
	}
	for _, p := range read.Pods() {
		out := pod(p.Namespace, p.Name)
		for _, g := range p.GPUs {
			out.GPUs = append(out.GPUs, podGPUUsage(g, old[p.Namespace+"/"+p.Name][g.UUID]))
		}
	}
	for _, p := range prev {
		for _, g := range p.GPUs {
			if failed[g.UUID] {
				out := pod(p.Namespace, p.Name)
				out.GPUs = append(out.GPUs, g)
			}
		}
	}
	var all []v1alpha1.PodGPUs
	for _, p := range byPod {
		if len(p.GPUs) >= 2 {
			slices.SortFunc(p.GPUs, func(a, b v1alpha1.PodGPUUsage) int { return cmp.Compare(a.Index, b.Index) })
			all = append(all, *p)
		}
	}
	slices.SortFunc(all, func(a, b v1alpha1.PodGPUs) int {
		return cmp.Or(cmp.Compare(len(b.GPUs), len(a.GPUs)), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	if len(all) > v1alpha1.MaxPodsInStatus {
		return all[:v1alpha1.MaxPodsInStatus], int32(len(all) - v1alpha1.MaxPodsInStatus)
	}
	return all, 0
}

// podGPUUsage is one pod's entry for one GPU, with prev's figures where they moved less than the
// thresholds.
func podGPUUsage(g accounting.PodGPU, prev v1alpha1.PodGPUUsage) v1alpha1.PodGPUUsage {
	out := v1alpha1.PodGPUUsage{UUID: g.UUID, Index: int32(g.Index)}
	if g.MemoryComplete {
		out.MemoryUsed = steadyMemory(g.MemoryBytes, prev.MemoryUsed)
	}
	if g.SMKnown {
		out.SMUtilization = steadySM(g.SMPercent, prev.SMUtilization)
	}
	return out
}
