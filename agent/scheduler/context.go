package scheduler

import "time"

// A ledger's context charge per process (ledger.go). The context reserve R is a guess made before the
// process exists; a process with a larger context (CUDA_MODULE_LOADING=EAGER, many modules, a device
// malloc heap outside the shim's view, extra contexts from cuCtxCreate) would take NVML's count past the
// claim while its allocations stayed within the ledger, and the claim guard judges NVML's count. So each
// Charge reads NVML (one read per GPU, fresh) and charges every process of the ledger what NVML counts
// beyond its grant: the shim charges an allocation before the driver makes it, so a grant is never less
// than what the process has allocated, and NVML less the grant is never more than the context really
// is. At the first Charge the grant is zero and the figure is exact; later, unused room (at most a
// couple of chunks, which the shim returns beyond that) makes it smaller than the context, so a
// process's charge only grows while it is connected: a context that shrinks keeps its charge, which
// costs the pod some room and never the claim. Guards.ContextFloor bounds a measurement from below.
//
// Between charges the ledgers of a GPU are measured every contextMeasureEvery while any has a member, so
// a context that grows while its process is idle (modules loaded at its first kernels) lowers what the
// others of its claim are offered, and a process that sizes itself from cuMemGetInfo a moment after its
// context exists sees its own context charged.
//
// A larger charge lowers the ledger's total at once; grants already beyond it stay (the memory is
// allocated) and the ledger refuses every Charge until frees bring it back within, as after a forced
// admission. Where NVML has no figure for the process (no NVML, a pid it does not list, a figure it may
// not read) the charge stays R.

// contextMeasureEvery is how often a GPU's ledgers are measured between charges: one NVML read each.
const contextMeasureEvery = time.Second

// measureContexts updates the context charges of m's ledger from a fresh NVML read.
func (s *Scheduler) measureContexts(q *queue, b *ledgerBook, m *member) {
	if s.opts.ProcessMemory == nil {
		return
	}
	b.mu.Lock()
	l := m.l
	b.mu.Unlock()
	if l != nil {
		s.measureLedger(q, b, l, true)
	}
}

// measureLedger updates l's context charges from NVML (fresh: a new read, else one up to procMemTTL old).
// A grant that shrank while NVML was read (a RETURN after frees NVML still counted) would take those
// frees for context: each member's largest grant since the read began (peak) stands for its grant.
// Measurements of a GPU take turns, so that one does not restart another's peaks.
func (s *Scheduler) measureLedger(q *queue, b *ledgerBook, l *ledger, fresh bool) {
	b.measuring.Lock()
	defer b.measuring.Unlock()
	b.mu.Lock()
	pids := make(map[*member]int32)
	for o := range l.members {
		if o.pid > 0 {
			pids[o] = o.pid
			o.peak = o.grant
		}
	}
	b.mu.Unlock()
	if len(pids) == 0 {
		return
	}
	seen := make(map[*member]uint64, len(pids))
	for o, pid := range pids {
		if v, ok := s.nvmlResident(q.uuid, pid, fresh); ok {
			seen[o] = v
		}
		fresh = false // one read serves every process of the GPU
	}
	if grown := b.measure(l, seen); grown > 0 {
		q.log.V(1).Info("Claim ledger charges a larger CUDA context than it counted; NVML's figure stands",
			"claim", l.key, "grown", grown, "contexts", b.contexts(l))
	}
}

// watchContexts measures q's ledgers every contextMeasureEvery from now on while any has a member.
func (s *Scheduler) watchContexts(q *queue, b *ledgerBook) {
	if s.opts.ProcessMemory == nil {
		return
	}
	b.mu.Lock()
	arm := !b.watching && len(b.byKey) > 0
	b.watching = b.watching || arm
	b.mu.Unlock()
	if arm {
		q.clock.AfterFunc(contextMeasureEvery, func() { s.contextTick(q, b) })
	}
}

func (s *Scheduler) contextTick(q *queue, b *ledgerBook) {
	b.mu.Lock()
	ls := make([]*ledger, 0, len(b.byKey))
	for _, l := range b.byKey {
		ls = append(ls, l)
	}
	b.watching = len(ls) > 0 // none: the next admission arms it again
	b.mu.Unlock()
	if len(ls) == 0 {
		return
	}
	for i, l := range ls {
		s.measureLedger(q, b, l, i == 0)
	}
	q.clock.AfterFunc(contextMeasureEvery, func() { s.contextTick(q, b) })
}

// measure applies NVML's figures to l's members (each less its peak grant) and returns by how much the
// context charges grew.
func (b *ledgerBook) measure(l *ledger, seen map[*member]uint64) uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var grown uint64
	changed := false
	for o, v := range seen {
		if o.l != l || o.gone {
			continue // left or moved while NVML was read
		}
		ctx := max(b.floor, v-min(v, max(o.peak, o.grant)))
		if o.measured {
			ctx = max(ctx, o.ctx)
		}
		o.measured = true
		if ctx == o.ctx {
			continue
		}
		if ctx > o.ctx {
			grown += ctx - o.ctx
		}
		l.contexts += ctx - o.ctx // unsigned wrap-around sums correctly either way
		o.ctx = ctx
		changed = true
	}
	if changed {
		b.settleLocked(l, true) // measured, not decided: it may take the ledger beyond its total
		b.pushLocked(l, nil)
	}
	return grown
}

func (b *ledgerBook) contexts(l *ledger) uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return l.contexts
}
