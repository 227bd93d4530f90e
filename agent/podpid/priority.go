package podpid

import (
	"context"
	"time"
)

// priorityRelist bounds how often a pid of an unknown pod makes Priority (and PodOf) list this node's pods again.
// It is shorter than MinRelist: a pod the list misses would run at the lowest priority for the life of
// its connection, and only a new pod's processes (a pod UID the list has not seen) trigger a list. A
// pod's processes connect seconds after it was created, so a list this recent has it.
const priorityRelist = 200 * time.Millisecond

// Priority returns the scheduling priority of the pod pid runs in: its spec.priority, the value of its
// PriorityClass that the API server's admission resolved and that the pod's own processes cannot
// change. ok is false for a process outside any pod, or in a pod this node does not list (yet).
func (r *Resolver) Priority(ctx context.Context, pid int32) (priority int32, ok bool) {
	procRoot := r.ProcRoot
	if procRoot == "" {
		procRoot = "/proc"
	}
	uid, ok := UIDOf(procRoot, pid)
	if !ok {
		return 0, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, known := r.byUID[uid]; !known && (r.listing != nil || r.lastList.IsZero() || r.clock().Since(r.lastList) >= priorityRelist) {
		r.refreshLocked(ctx)
	}
	if _, known := r.byUID[uid]; !known {
		return 0, false
	}
	return r.prioByID[uid], true // a pod without a priority runs at 0, as the kube-scheduler treats it
}
