package gpunode

import (
	"sort"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
)

// rollout coordinates admission between passes. The count of nodes in flight always comes from the
// cache index; kept here are only what bridges the gap between a write and the cache seeing it, and a
// wake-up list. A restart loses neither: a write either landed (and the fresh cache shows it) or did not,
// and the initial list re-runs every node, which rebuilds the wake-up list.
type rollout struct {
	// clock decides when a reservation or a remembered node count has expired.
	clock clock.PassiveClock

	// admission serializes the decisions (count, compare, reserve); the writes run in parallel.
	admission sync.Mutex
	// reserved holds, per policy, nodes admitted whose write the cache does not show yet. A node leaves
	// only once the cache shows its write, so it is never in neither set and no slot is handed out twice.
	reserved map[string]map[string]*reservation

	// selected remembers, per policy, how many GPU nodes its nodeSelector selected and when (admission
	// held).
	selected map[string]selectedCount

	mu      sync.Mutex
	waiting map[string]map[string]bool // policy -> nodes waiting on it
	limits  map[string]int             // policy -> maxUnavailable last computed
	// nudges carries nodes to re-run when a node leaves a wait list without taking a slot.
	nudges chan event.GenericEvent
}

// newRollout keeps its times on c; nil means the real clock.
func newRollout(c clock.PassiveClock) *rollout {
	if c == nil {
		c = clock.RealClock{}
	}
	return &rollout{
		clock:    c,
		waiting:  map[string]map[string]bool{},
		reserved: map[string]map[string]*reservation{},
		selected: map[string]selectedCount{},
		limits:   map[string]int{},
		nudges:   make(chan event.GenericEvent, 1024),
	}
}

// reservation is an admitted node's claim on a slot until the cache shows its write.
type reservation struct {
	// generation is the GPUNode generation the write produced; 0 while the write is under way.
	generation int64
	// since bounds a reservation whose write the cache never reports (an informer that lost its watch
	// reports it when it lists again, but a slot must not stay taken on a missed event).
	since time.Time
}

// reservationTTL is how long a reservation counts at most.
const reservationTTL = 30 * time.Second

// reserve records that node was admitted for policy; call it with admission held.
func (r *rollout) reserve(policy, node string) {
	if r.reserved[policy] == nil {
		r.reserved[policy] = map[string]*reservation{}
	}
	r.reserved[policy][node] = &reservation{since: r.clock.Now()}
}

// written records the generation the node's admitted write produced. The caller then checks the cache
// once: together with observed, run by the informer after the cache is updated, one of the two always
// sees both the generation and the cached object, so no reservation outlives the cache lag.
func (r *rollout) written(node string, policies []string, generation int64) {
	r.admission.Lock()
	defer r.admission.Unlock()
	for _, p := range policies {
		if res := r.reserved[p][node]; res != nil {
			res.generation = generation
		}
	}
}

// observed drops the node's reservations whose write the cache now shows (generation or later).
func (r *rollout) observed(node string, generation int64) {
	r.admission.Lock()
	defer r.admission.Unlock()
	for p, nodes := range r.reserved {
		if res := nodes[node]; res != nil && res.generation > 0 && generation >= res.generation {
			r.drop(p, node)
		}
	}
}

// unreserve drops the node's reservations: its write failed or was not needed.
func (r *rollout) unreserve(node string, policies []string) {
	r.admission.Lock()
	defer r.admission.Unlock()
	for _, p := range policies {
		r.drop(p, node)
	}
}

func (r *rollout) drop(policy, node string) {
	delete(r.reserved[policy], node)
	if len(r.reserved[policy]) == 0 {
		delete(r.reserved, policy)
	}
}

// othersInFlight counts the nodes other than self that the cache shows in flight for the policy or that
// hold a live reservation; call it with admission held.
func (r *rollout) othersInFlight(cached []string, policy, self string) int {
	live := map[string]bool{}
	for name, res := range r.reserved[policy] {
		if name != self && r.clock.Since(res.since) < reservationTTL {
			live[name] = true
		}
	}
	n := len(live)
	for _, name := range cached {
		if name != self && !live[name] {
			n++
		}
	}
	return n
}

func (r *rollout) setLimit(policy string, limit int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.limits[policy] = limit
}

// setWaiting records the policies a node now waits on. When the node stops waiting on a policy, the next
// waiting nodes of that policy are nudged: the node may have left without taking the slot it was woken for.
func (r *rollout) setWaiting(node string, policies []string) {
	now := map[string]bool{}
	for _, p := range policies {
		now[p] = true
	}
	var left []string
	r.mu.Lock()
	for p, nodes := range r.waiting {
		if nodes[node] && !now[p] {
			delete(nodes, node)
			if len(nodes) == 0 {
				delete(r.waiting, p)
			}
			left = append(left, p)
		}
	}
	for p := range now {
		if r.waiting[p] == nil {
			r.waiting[p] = map[string]bool{}
		}
		r.waiting[p][node] = true
	}
	r.mu.Unlock()
	for _, p := range left {
		for _, n := range r.next(p) {
			r.nudges <- event.GenericEvent{Object: gpuNodeRef(n)}
		}
	}
}

// forget drops a node that no longer exists from every wait list.
func (r *rollout) forget(node string) { r.setWaiting(node, nil) }

// isWaiting says whether node waits for a slot of any policy.
func (r *rollout) isWaiting(node string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, nodes := range r.waiting {
		if nodes[node] {
			return true
		}
	}
	return false
}

// next returns the waiting nodes of a policy to re-run when a slot frees: the first limit of them in name
// order, which is the order they are admitted in.
func (r *rollout) next(policy string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	nodes := make([]string, 0, len(r.waiting[policy]))
	for n := range r.waiting[policy] {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	limit := r.limits[policy]
	if limit < 1 {
		limit = 1
	}
	if len(nodes) > limit {
		nodes = nodes[:limit]
	}
	return nodes
}

// wake queues the next waiting nodes of each policy.
func (r *rollout) wake(q workqueue.TypedRateLimitingInterface[reconcile.Request], policies []string) {
	for _, p := range policies {
		for _, n := range r.next(p) {
			q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Name: n}})
		}
	}
}

func gpuNodeRef(name string) *v1.GPUNode {
	gn := &v1.GPUNode{}
	gn.Name = name
	return gn
}

// policiesReserving lists the policies the node holds a reservation for.
func (r *rollout) policiesReserving(node string) []string {
	r.admission.Lock()
	defer r.admission.Unlock()
	var out []string
	for p, nodes := range r.reserved {
		if nodes[node] != nil {
			out = append(out, p)
		}
	}
	return out
}

type selectedCount struct {
	generation int64
	at         time.Time
	n          int
}

// selectedCountTTL is how long a node count serves a percentage budget.
const selectedCountTTL = time.Second

// selectedCount returns a remembered count for the policy generation if still fresh; admission held.
func (r *rollout) selectedCount(policy string, generation int64) (int, bool) {
	c, ok := r.selected[policy]
	if !ok || c.generation != generation || r.clock.Since(c.at) > selectedCountTTL {
		return 0, false
	}
	return c.n, true
}

// rememberSelected stores a node count; admission held.
func (r *rollout) rememberSelected(policy string, generation int64, n int) {
	r.selected[policy] = selectedCount{generation: generation, at: r.clock.Now(), n: n}
}
