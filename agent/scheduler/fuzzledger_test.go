package scheduler

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// FuzzLedger drives one GPU's ledgers with any order of joins, leaves, charges, returns and re-announced
// grants and NVML measurements of contexts from clients of two claims and checks after every step: no
// charge and no join takes a ledger's grants beyond M less its context charges (a join with no room for
// its context is refused), a ledger within its bound stays within unless a re-announced grant (a refused
// client's only where NVML shows its context) or a measured context moved it, the grants and the context
// charges sum to what the ledger counts, and the scheduler recorded no broken invariant.
func FuzzLedger(f *testing.F) {
	f.Add([]byte{0, 0, 2, 10, 0, 1, 2, 40, 3, 0, 1, 0, 2, 200, 4, 1})
	f.Add([]byte{0, 1, 0, 1, 5, 0, 2, 255, 2, 255, 1, 1, 3, 7, 2, 1})
	f.Fuzz(func(t *testing.T, in []byte) {
		if err := runLedgerSteps(in); err != nil {
			t.Fatal(err)
		}
	})
}

func runLedgerSteps(in []byte) error {
	b := &ledgerBook{gpu: "GPU-f", reserve: 3 * mib, chunk: 4 * mib, floor: mib, byKey: map[string]*ledger{}}
	claims := []Claim{{Key: "a", Memory: 40 * mib}, {Key: "b", Memory: 7 * mib}}
	var ms []*member
	for i := 0; i+1 < len(in); i += 2 {
		op, arg := in[i]%6, int(in[i+1])
		before := ledgerBounds(b)
		raisesOK := false
		var pick *member
		if len(ms) > 0 {
			pick = ms[arg%len(ms)]
		}
		switch {
		case op == 0 || pick == nil: // a process connects (every 16th without a claim)
			c := claims[arg%2]
			m := b.join(c, arg%16 != 15, int32(arg)+1, 6, func([]byte) bool { return true }, nil, 0)
			b.welcome(m)
			ms = append(ms, m)
		case op == 1: // a process ends
			b.leave(pick)
			for k, m := range ms {
				if m == pick {
					ms = append(ms[:k], ms[k+1:]...)
					break
				}
			}
		case op == 2:
			b.charge(pick, uint32(i), uint64(arg)*mib/2, 0)
		case op == 3:
			_ = b.giveBack(pick, 0, uint64(arg)*mib/4, false)
		case op == 4: // a re-announced grant (refused after the connection's first charge; admits a refused
			// client past the bound only where NVML shows its context: odd args)
			seen := arg%2 == 1
			b.mu.Lock()
			raisesOK = !pick.charged && (pick.l != nil || seen)
			b.mu.Unlock()
			_ = b.giveBack(pick, ReturnHold, uint64(arg)*mib/3, seen)
		case op == 5: // NVML's figure for the process: its grant and a context of up to 8 MiB
			raisesOK = true
			if pick.l != nil {
				b.measure(pick.l, map[*member]uint64{pick: pick.grant + uint64(arg)*mib/32})
			}
		}
		after := ledgerBounds(b)
		for key, a := range after {
			p, existed := before[key]
			if a.granted != a.sum {
				return fmt.Errorf("step %d: ledger %s counts %d, its grants sum to %d", i/2, key, a.granted, a.sum)
			}
			if a.contexts != a.ctxSum {
				return fmt.Errorf("step %d: ledger %s counts contexts %d, its members' sum to %d", i/2, key, a.contexts, a.ctxSum)
			}
			if a.granted+a.contexts > a.claim && !raisesOK && (!existed || p.granted+p.contexts <= p.claim || a.granted > p.granted) {
				return fmt.Errorf("step %d (op %d): ledger %s: grants %d + contexts %d beyond the claim %d (before: %+v)",
					i/2, op, key, a.granted, a.contexts, a.claim, p)
			}
		}
		if len(b.broken) > 0 {
			return fmt.Errorf("step %d: %v", i/2, b.broken)
		}
	}
	return nil
}

type ledgerBound struct{ granted, sum, n, claim, contexts, ctxSum uint64 }

func ledgerBounds(b *ledgerBook) map[string]ledgerBound {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[string]ledgerBound{}
	for k, l := range b.byKey {
		lb := ledgerBound{granted: l.granted, n: uint64(len(l.members)), claim: l.claim, contexts: l.contexts}
		for m := range l.members {
			lb.sum += m.grant
			lb.ctxSum += m.ctx
		}
		out[k] = lb
	}
	return out
}

// TestLedgerRandomSteps runs FuzzLedger's check over many fixed pseudo-random inputs, so CI explores
// more than the seeds without the fuzzing engine.
func TestLedgerRandomSteps(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 3000 {
		in := make([]byte, 2*(1+r.IntN(60)))
		for i := range in {
			in[i] = byte(r.Uint32())
		}
		if err := runLedgerSteps(in); err != nil {
			t.Fatalf("input %v: %v", in, err)
		}
	}
}
