package scheduler

// ChargeRefusal is one Charge a claim's ledger refused: an allocation of the claim's processes failed
// with out of memory at the claim's size. The ledger's own count (LedgerState.Refusals) lives only as
// long as the ledger, which goes with its last process, and a process that fails an allocation often
// exits at once; OnChargeRefused hands each refusal to the owner as it happens, so none is lost.
type ChargeRefusal struct {
	// GPU is the GPU's uuid; Key the ledger's key (Claim.Key: the agent's "namespace/name" of each
	// claim of the ledger group, joined by commas).
	GPU, Key string
	// Claim is the ledger's M; Demand what the claim's processes would have held had the charge been
	// granted: their context charges, their grants and the bytes asked.
	Claim, Demand uint64
}

// chargeMessage serves a Charge, and tells Options.OnChargeRefused when the ledger refused it.
func (s *Scheduler) chargeMessage(q *queue, m *member, pid int32, msg Message) error {
	if msg.Type != MsgCharge || m == nil || s.opts.OnChargeRefused == nil {
		return s.ledgerMessage(q, m, pid, msg)
	}
	b := s.book(q)
	b.mu.Lock()
	l := m.l
	var before uint64
	if l != nil {
		before = l.refusals
	}
	b.mu.Unlock()
	err := s.ledgerMessage(q, m, pid, msg)
	if l == nil {
		return err
	}
	b.mu.Lock()
	refused := l.refusals > before
	r := ChargeRefusal{GPU: q.uuid, Key: l.key, Claim: l.claim, Demand: l.contexts + l.granted + msg.Bytes}
	b.mu.Unlock()
	if refused {
		s.opts.OnChargeRefused(r)
	}
	return err
}
