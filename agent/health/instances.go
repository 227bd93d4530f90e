package health

import (
	"fmt"
	"time"

	"github.com/gpusharing/gpusharing/agent/gpu"
)

// A critical Xid NVML places on a MIG instance marks the whole GPU, as the device plugin does, except on
// an instance created for a claim (dynamic MIG, ScopeInstances): the instance is its claim's alone and
// the others on the GPU are not touched, so only that instance is marked. The mark ends with the
// instance (ForgetInstance, when the claim's instance is destroyed): a new instance gets a fresh start.

// ScopeInstances sets which GPU instances' Xids mark the instance alone.
func (w *Watcher) ScopeInstances(f func(gpuUUID string, giID int) bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.scoped = f
}

// markInstance marks the event's instance when it is scoped, and says whether it was.
func (w *Watcher) markInstance(ev gpu.Event, msg string, now time.Time) bool {
	w.mu.Lock()
	scoped := w.scoped
	w.mu.Unlock()
	// Outside the lock: the scope reads the kubelet plugin's ledger.
	if scoped == nil || ev.UUID == "" || !scoped(ev.UUID, ev.GIID) {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.instances == nil {
		w.instances = map[string]map[int]Health{}
	}
	if w.instances[ev.UUID] == nil {
		w.instances[ev.UUID] = map[int]Health{}
	}
	if h, ok := w.instances[ev.UUID][ev.GIID]; ok && !h.Healthy {
		return true // the first critical error stays
	}
	w.instances[ev.UUID][ev.GIID] = Health{Healthy: false, Monitored: true, Reason: ReasonXidError, Since: now,
		Message: msg + fmt.Sprintf(" (MIG GPU instance %d, compute instance %d, created for a claim; only this instance is marked)", ev.GIID, ev.CIID)}
	return true
}

// Instances returns the GPU's instances marked alone, by GPU instance id.
func (w *Watcher) Instances(gpuUUID string) map[int]Health {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[int]Health, len(w.instances[gpuUUID]))
	for id, h := range w.instances[gpuUUID] {
		out[id] = h
	}
	return out
}

// ForgetInstance drops an instance's mark once the instance is destroyed.
func (w *Watcher) ForgetInstance(gpuUUID string, giID int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.instances[gpuUUID], giID)
}
