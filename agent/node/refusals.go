package node

import (
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpusharing/gpusharing/agent/scheduler"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// ClaimRefusals is what the shim refused one sized claim on one GPU: allocations its pods' processes
// asked past the claim (the GPU's scheduler's claim ledger). The recommender reads it from the claim's
// status (status.gpus[].sized.claims) and raises the workload's target, as for a pod over its claim.
type ClaimRefusals struct {
	Count int64
	// Demand is the most memory a refused allocation would have brought the claim's processes to.
	Demand uint64
	Last   time.Time
}

type refusalKey struct{ gpu, namespace, name string }

// refusalBook keeps the refusals of each claim for as long as the claim is sized on the node: the
// ledger's own count goes with its last process, which a failed allocation often ends.
type refusalBook struct {
	mu      sync.Mutex
	byClaim map[refusalKey]ClaimRefusals
}

// record counts one refusal against each claim of the ledger's key ("namespace/name" joined by commas).
func (b *refusalBook) record(r scheduler.ChargeRefusal, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.byClaim == nil {
		b.byClaim = map[refusalKey]ClaimRefusals{}
	}
	for _, claim := range strings.Split(r.Key, ",") {
		ns, name, ok := strings.Cut(claim, "/")
		if !ok {
			continue
		}
		k := refusalKey{r.GPU, ns, name}
		c := b.byClaim[k]
		c.Count++
		c.Demand = max(c.Demand, r.Demand)
		c.Last = now
		b.byClaim[k] = c
	}
}

// publish sets each claim's refusals in g's sized status, and keeps only the claims g still lists. A
// claim the book does not know takes its figures from prev (the status before, which an agent restart
// keeps), so counting goes on from there.
func (b *refusalBook) publish(g *v1alpha1.GPUStatus, prev *v1alpha1.GPUStatus) {
	if g.Sized == nil {
		return
	}
	prevByName := map[refusalKey]*v1alpha1.SizedClaimStatus{}
	if prev != nil && prev.Sized != nil {
		for i, c := range prev.Sized.Claims {
			prevByName[refusalKey{g.UUID, c.Namespace, c.Name}] = &prev.Sized.Claims[i]
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	listed := map[refusalKey]bool{}
	for i := range g.Sized.Claims {
		c := &g.Sized.Claims[i]
		k := refusalKey{g.UUID, c.Namespace, c.Name}
		listed[k] = true
		r, ok := b.byClaim[k]
		if p := prevByName[k]; !ok && p != nil && p.AllocationsRefused > 0 {
			r = ClaimRefusals{Count: p.AllocationsRefused}
			if p.RefusedDemand != nil {
				r.Demand = uint64(p.RefusedDemand.Value())
			}
			if p.LastRefusalTime != nil {
				r.Last = p.LastRefusalTime.Time
			}
			if b.byClaim == nil {
				b.byClaim = map[refusalKey]ClaimRefusals{}
			}
			b.byClaim[k], ok = r, true
		}
		if !ok {
			continue
		}
		c.AllocationsRefused = r.Count
		c.RefusedDemand = resource.NewQuantity(int64(r.Demand), resource.BinarySI)
		last := metav1.NewTime(r.Last.Truncate(time.Second))
		c.LastRefusalTime = &last
	}
	for k := range b.byClaim {
		if k.gpu == g.UUID && !listed[k] {
			delete(b.byClaim, k)
		}
	}
}

// chargeRefused is the schedulers' Guards.OnChargeRefused: it counts the refusal and wakes a pass, which
// publishes it.
func (s *ShimSchedulers) chargeRefused(next func(scheduler.ChargeRefusal)) func(scheduler.ChargeRefusal) {
	return func(r scheduler.ChargeRefusal) {
		now := time.Now()
		if s.Clock != nil {
			now = s.Clock.Now()
		}
		s.refused.record(r, now)
		if next != nil {
			next(r)
		}
		s.notify()
	}
}

// publishRefusals sets the refusals of g's sized claims (refusalBook.publish); nothing where no
// scheduler runs.
func (s *ShimSchedulers) publishRefusals(g, prev *v1alpha1.GPUStatus) {
	if s == nil {
		return
	}
	s.refused.publish(g, prev)
}
