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

// A pod lookup can fail for a while: the API server is slow or away (the lookup has 500 ms), or the
// pod is so new that the agent's view of it lags its first process. Such a client starts opportunistic
// (a lookup that fails never makes anyone production) and its pod is looked up again, outside the
// queue's lock, after ReResolveFirst, then after twice as long each time up to ReResolveMax, for as long
// as the client stays connected: an API server outage of any length ends with the client in its pod's
// class and ledger. Found, the client takes its pod's class in place, as after a new threshold
// (reclassifyLocked).
const (
	ReResolveFirst = 500 * time.Millisecond
	ReResolveMax   = 30 * time.Second
	// reResolveLogAfter is the failed attempt after which the client's unknown pod is logged (once).
	reResolveLogAfter = 6
)

// reresolve looks the pod of the client c (the kernel's pid) up again until its class is known and,
// for a process of a pod, it is placed in its claim's ledger (lm, claimPending), or done (its connection
// ended). A pod without a claim on the GPU is looked up for as long as its client stays connected, at
// ReResolveMax once the back-off reached it: the lookup of a known pod needs no API call.
func (s *Scheduler) reresolve(q *queue, c *client, lm *member, pid int32, asked Class, classKnown bool, done <-chan struct{}) {
	d := ReResolveFirst
	for attempt := 1; ; attempt++ {
		t := s.opts.Clock.NewTimer(d)
		select {
		case <-done:
			t.Stop()
			return
		case <-t.C():
		}
		found := false
		if !classKnown {
			if src := s.classSource(pid, asked); src.known {
				q.setClass(c, src)
				classKnown, found = true, true
			}
		}
		if found || s.claimPending(q, lm) {
			s.ledgerAttach(q, lm, pid)
		}
		if classKnown && !s.claimPending(q, lm) {
			return
		}
		if attempt == reResolveLogAfter && !classKnown {
			q.log.Info("Shim client's pod still unknown; it stays opportunistic and outside its claim's ledger until found",
				"client", c.id, "pid", pid, "attempts", attempt+1, "retryEvery", ReResolveMax)
		}
		d = min(2*d, ReResolveMax)
	}
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
