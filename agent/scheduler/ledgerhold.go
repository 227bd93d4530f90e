package scheduler

// A refused client's Hold.
//
// A client announces a grant (RETURN flags HOLD) when it has a CUDA context on the GPU: one created
// before a scheduler restart, whose new connection found its claim's ledger full. Such memory exists
// whatever the ledger says, so it is accounted, even beyond the claim, and every Charge is refused until
// frees bring the ledger back within (ledger.go). But a Hold is the client's word: a process that was
// refused before it made a context could announce one and so pass the ledger. So a refused client's
// Hold admits it past the ledger only where NVML shows its process holding memory on the GPU (its
// context is real); otherwise it is admitted only where the ledger has room for its context and the
// bytes it announces, as any new process would be, and else stays refused (told so again).

// admitHoldLocked decides on the Hold of bytes from the refused client m; seen: NVML shows m's process
// holding memory on the GPU. True when m is admitted.
func (b *ledgerBook) admitHoldLocked(m *member, bytes uint64, seen bool) bool {
	cl := *m.refused
	if seen {
		return b.admitLocked(m, cl, true, 0)
	}
	l := b.byKey[cl.Key]
	var granted, contexts uint64
	if l != nil {
		granted, contexts = l.granted, l.contexts
	}
	// Room for its context (charged as any joining process's) and the bytes it announces, beside the
	// contexts the ledger charges its processes now (measured where NVML has figures).
	need := contexts + m.ctx
	if need <= cl.Memory && granted <= cl.Memory-need && bytes <= cl.Memory-need-granted {
		return b.admitLocked(m, cl, false, 0)
	}
	if l != nil {
		l.refusals++
	}
	m.sendOrDrop(b.ledgerMsgLocked(m))
	return false
}

// contextSeen: NVML, read now, shows the process pid holding memory on q's GPU. False where it cannot
// tell (no NVML, a pid the kernel did not give).
func (s *Scheduler) contextSeen(q *queue, pid int32) bool {
	used, ok := s.nvmlResident(q.uuid, pid, true)
	return ok && used > 0
}
