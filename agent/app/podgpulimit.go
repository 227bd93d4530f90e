package app

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// podGPU is one pod on one GPU.
type podGPU struct {
	uid types.UID
	gpu string
}

// podGPULimit lets one report through per pod and GPU in every window: the log line and the event of a
// process refused a GPU's scheduler or revoked there, which repeat for as long as the process runs.
type podGPULimit struct {
	every time.Duration
	clock clock.PassiveClock

	mu   sync.Mutex
	last map[podGPU]time.Time
}

// allow says whether a report on pod uid and GPU gpu may go out now, and if so counts it.
func (l *podGPULimit) allow(uid types.UID, gpu string) bool {
	key, now := podGPU{uid, gpu}, l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if last, ok := l.last[key]; ok && now.Sub(last) < l.every {
		return false
	}
	if l.last == nil {
		l.last = map[podGPU]time.Time{}
	}
	l.last[key] = now
	for k, at := range l.last {
		if now.Sub(at) >= l.every {
			delete(l.last, k)
		}
	}
	return true
}
