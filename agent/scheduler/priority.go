package scheduler

import "time"

// classSource gathers what decides the class of the client pid, whose hello asked for asked
// (qos.go). Where Options.PodPriority is set, the pod decides: the hello comes from the process's
// environment (GPUSHARE_PRIORITY), which the pod's own code controls, so on its own it would let any
// process make itself production and preempt every other tenant; the pod's priority is written through
// the API server, under its admission rules. pid is the peer's pid as the kernel gives it
// (SO_PEERCRED); 0, where the kernel gives none, leaves the pod unknown (opportunistic): the pid a
// hello reports is the process's word, and naming another process's pod would borrow its class. The
// lookup runs between the client's HELLO and its WELCOME, outside the queue's lock.
func (s *Scheduler) classSource(pid int32, asked Class) classSource {
	if s.opts.PodPriority == nil {
		return classSource{asked: asked}
	}
	if pid == 0 {
		return classSource{asked: asked, fromPod: true}
	}
	v, ok := s.opts.PodPriority(pid)
	return classSource{asked: asked, fromPod: true, value: v, known: ok}
}

// A pod lookup can fail for a while: the API server is slow (the lookup has 500 ms), or the pod is so
// new that the agent's view of it lags its first process. Such a client starts opportunistic (a lookup
// that fails never makes anyone production) and its pod is looked up again, outside the queue's lock,
// after ReResolveFirst, then after twice as long each time, ReResolveAttempts times in all (about 31 s
// with the defaults: past the seconds a new pod takes to appear). Found, the client takes its pod's
// class in place, as after a new threshold (reclassifyLocked).
const (
	ReResolveFirst    = 500 * time.Millisecond
	ReResolveAttempts = 6
)

// reresolve looks the pod of the client c (the kernel's pid) up again until found, out of attempts, or
// done (its connection ended). Found, the client also joins its claim's ledger (lm), which the unknown
// pod kept it out of.
func (s *Scheduler) reresolve(q *queue, c *client, lm *member, pid int32, asked Class, done <-chan struct{}) {
	d := ReResolveFirst
	for range ReResolveAttempts {
		t := s.opts.Clock.NewTimer(d)
		select {
		case <-done:
			t.Stop()
			return
		case <-t.C():
		}
		if src := s.classSource(pid, asked); src.known {
			q.setClass(c, src)
			s.ledgerAttach(q, lm, pid)
			return
		}
		d *= 2
	}
	q.log.Info("Shim client's pod still unknown; it stays opportunistic", "client", c.id, "pid", pid,
		"attempts", ReResolveAttempts+1)
}

// setClass gives c the class src decides, now that its pod is known.
func (q *queue) setClass(c *client, src classSource) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if c.state == stateGone {
		return
	}
	q.log.Info("Shim client's pod found", "client", c.id, "pid", c.pid, "podPriority", src.value,
		"class", q.classLocked(src).String())
	c.classSrc = src
	q.reclassifyLocked()
	q.termsLocked()
	q.dispatchLocked(nil)
}

// className names c's class.
func (q *queue) className(c *client) string {
	q.mu.Lock()
	defer q.mu.Unlock()
	return c.class.String()
}
