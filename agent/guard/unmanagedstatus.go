package guard

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// memoryStep is the least memory change of a named process the status publishes (the usage's threshold:
// agent/node/usage.go): a process's memory moves all the time, every status write is an etcd write.
const memoryStep = 256 << 20

// maxNamedInMessage bounds the processes a Managed=False message names.
const maxNamedInMessage = 4

// Status is status.gpus[].unmanaged for the verdict; prev is what was published, kept where the GPU was
// not read and whose memory figures are kept where they moved less than memoryStep.
func Status(v Verdict, prev *v1alpha1.GPUUnmanaged) *v1alpha1.GPUUnmanaged {
	if !v.Read {
		return prev.DeepCopy()
	}
	out := &v1alpha1.GPUUnmanaged{Clients: int32(v.Clients), HostProcesses: int32(v.Host)}
	old := map[string]*resource.Quantity{}
	if prev != nil {
		for _, p := range prev.Processes {
			old[fmt.Sprintf("%s/%s/%d", p.Namespace, p.Pod, p.PID)] = p.Memory
		}
	}
	named := v.Named
	if n := len(named) - v1alpha1.MaxUnmanagedInStatus; n > 0 {
		out.OmittedProcesses = int32(n)
		named = named[:v1alpha1.MaxUnmanagedInStatus]
	}
	for _, p := range named {
		up := v1alpha1.UnmanagedProcess{Namespace: p.Namespace, Pod: p.Name, Container: p.Container, PID: p.PID}
		if p.MemoryKnown {
			up.Memory = steady(p.MemoryBytes, old[fmt.Sprintf("%s/%s/%d", p.Namespace, p.Name, p.PID)])
		}
		out.Processes = append(out.Processes, up)
	}
	return out
}

// steady is prev where used moved less than memoryStep from it, else used rounded down to MiB.
func steady(used uint64, prev *resource.Quantity) *resource.Quantity {
	if prev != nil {
		p := uint64(max(prev.Value(), 0))
		if max(used, p)-min(used, p) < memoryStep {
			return prev
		}
	}
	return resource.NewQuantity(int64(used>>20)<<20, resource.BinarySI)
}

// SetManaged sets the checked GPU's Managed condition from the verdict; unread keeps prev's.
func SetManaged(g *v1alpha1.GPUStatus, v Verdict, action v1alpha1.UnmanagedAction, prev []metav1.Condition) {
	if !v.Read {
		if c := meta.FindStatusCondition(prev, v1alpha1.ConditionManaged); c != nil {
			meta.SetStatusCondition(&g.Conditions, *c)
		}
		return
	}
	what := "its shim scheduler"
	if v.Kind == KindMPS {
		what = "its MPS server"
	}
	if len(v.Named) == 0 {
		meta.SetStatusCondition(&g.Conditions, metav1.Condition{Type: v1alpha1.ConditionManaged, Status: metav1.ConditionTrue,
			Reason: v1alpha1.ReasonAllManaged, Message: fmt.Sprintf("every process of a pod on the GPU is a client of %s", what)})
		return
	}
	names := make([]string, 0, maxNamedInMessage)
	for _, p := range v.Named[:min(len(v.Named), maxNamedInMessage)] {
		names = append(names, p.describe(false)) // memory moves: the condition would be rewritten at every read
	}
	msg := strings.Join(names, "; ")
	if n := len(v.Named) - maxNamedInMessage; n > 0 {
		msg += fmt.Sprintf("; and %d more", n)
	}
	verb := "reported"
	if action == v1alpha1.UnmanagedEvict {
		verb = "evicted (unmanagedProcesses Evict)"
	}
	meta.SetStatusCondition(&g.Conditions, metav1.Condition{Type: v1alpha1.ConditionManaged, Status: metav1.ConditionFalse,
		Reason: v1alpha1.ReasonUnmanagedProcesses, Message: fmt.Sprintf("processes of pods that are not clients of %s, %s: %s", what, verb, msg)})
}

// describe is "default/train container main pid 4242", with " (2Gi)" where withMemory and known.
func (p Process) describe(withMemory bool) string {
	s := p.PodRef.String()
	if p.Container != "" {
		s += " container " + p.Container
	}
	s += fmt.Sprintf(" pid %d", p.PID)
	if withMemory && p.MemoryKnown {
		s += " (" + resource.NewQuantity(int64(p.MemoryBytes>>20)<<20, resource.BinarySI).String() + ")"
	}
	return s
}
