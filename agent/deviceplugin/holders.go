package deviceplugin

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/gpusharing/gpusharing/agent/deviceid"
	"github.com/gpusharing/gpusharing/agent/podres"
)

// DefaultHoldersMaxAge is how long PodHolders answers from one list of the kubelet's allocations.
const DefaultHoldersMaxAge = time.Second

// PodHolders says whether a pod holds a device of a GPU, from the kubelet's PodResources: a container
// of the pod was allocated the GPU's uuid, one of its replicas (<uuid>::<n>) or, for a MIG GPU, nothing
// of it under that uuid. Any resource counts, as for the drain: whichever plugin allocated the device,
// the pod holds the GPU.
//
// The shim scheduler asks once per connection, and a refused shim asks again every second or so, so one
// list answers for up to MaxAge. A "no" is believed only from a list begun after the pod was first asked
// about: the kubelet allocates a pod's devices before it starts any of its containers, so such a list
// has them, and a pod whose process connects right after a list taken before its allocation is not
// turned away by it. Lists run one at a time; a caller waits for the one in flight at most until its
// context ends.
type PodHolders struct {
	// Lister is the kubelet's PodResources API.
	Lister PodResourcesLister
	// MaxAge is how long one list answers (DefaultHoldersMaxAge).
	MaxAge time.Duration
	// Clock dates the lists; nil is the real clock.
	Clock clock.PassiveClock

	mu      sync.Mutex
	held    map[podGPU]bool
	listed  time.Time // when the list in held began; zero before the first
	listing *holdersList
	asked   map[podKey]time.Time // when each pod was first asked about, for the "no" rule
}

type podKey struct{ namespace, name string }

type podGPU struct {
	pod podKey
	gpu string
}

// holdersList is one list in flight: done closes when it ends, with err its failure.
type holdersList struct {
	done  chan struct{}
	began time.Time
	err   error
}

// askedTTL is how long PodHolders remembers when a pod was first asked about; a pod asked about again
// later counts as new (one more fresh list for its first "no").
const askedTTL = time.Minute

// Holds says whether pod namespace/name holds a device of GPU gpuUUID; an error says the kubelet could
// not be asked in time (or answered with an error), which is not a "no".
func (h *PodHolders) Holds(ctx context.Context, namespace, name, gpuUUID string) (bool, error) {
	pod := podKey{namespace, name}
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	first, seen := h.asked[pod]
	if !seen || now.Sub(first) >= askedTTL {
		if h.asked == nil {
			h.asked = map[podKey]time.Time{}
		}
		first = now
		h.asked[pod] = first
	}
	fresh := !h.listed.IsZero() && now.Sub(h.listed) < h.maxAge()
	key := podGPU{pod, gpuUUID}
	if fresh && (h.held[key] || !h.listed.Before(first)) {
		return h.held[key], nil
	}
	if err := h.refreshLocked(ctx, first); err != nil {
		return false, err
	}
	return h.held[key], nil
}

// refreshLocked waits for a list begun at or after since, starting one where none is in flight or the one
// in flight began before since. h.mu held on entry and on return, dropped while waiting.
func (h *PodHolders) refreshLocked(ctx context.Context, since time.Time) error {
	for {
		l := h.listing
		if l == nil || l.began.Before(since) {
			if l == nil {
				l = &holdersList{done: make(chan struct{}), began: h.now()}
				h.listing = l
				go h.list(l)
			} else {
				// One older than the pod's first question is in flight: wait for it, then start another.
				if err := h.waitLocked(ctx, l); err != nil {
					return err
				}
				continue
			}
		}
		return h.waitLocked(ctx, l)
	}
}

func (h *PodHolders) waitLocked(ctx context.Context, l *holdersList) error {
	h.mu.Unlock()
	defer h.mu.Lock()
	select {
	case <-l.done:
		return l.err
	case <-ctx.Done():
		return fmt.Errorf("waiting for the kubelet's pod resources: %w", ctx.Err())
	}
}

// list reads the kubelet's allocations into h.held and ends l.
func (h *PodHolders) list(l *holdersList) {
	resp, err := podres.List(context.Background(), h.Lister, heldListTimeout)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.listing = nil
	defer close(l.done)
	if err != nil {
		l.err = err
		return
	}
	held := map[podGPU]bool{}
	for d := range podres.Devices(resp) {
		held[podGPU{podKey{d.Namespace, d.Pod}, deviceid.Parse(d.ID).UUID}] = true
	}
	h.held, h.listed = held, l.began
	for pod, at := range h.asked {
		if l.began.Sub(at) >= askedTTL {
			delete(h.asked, pod)
		}
	}
}

func (h *PodHolders) maxAge() time.Duration {
	if h.MaxAge > 0 {
		return h.MaxAge
	}
	return DefaultHoldersMaxAge
}

func (h *PodHolders) now() time.Time {
	if h.Clock == nil {
		return time.Now()
	}
	return h.Clock.Now()
}
