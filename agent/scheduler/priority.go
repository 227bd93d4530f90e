package scheduler

// classSource gathers what decides the class of the client pid, whose hello asked for asked
// (qos.go). Where Options.PodPriority is set, the pod decides: the hello comes from the process's
// environment (GPUSHARE_PRIORITY), which the pod's own code controls, so on its own it would let any
// process make itself production and preempt every other tenant; the pod's priority is written through
// the API server, under its admission rules. The lookup runs between the client's HELLO and its
// WELCOME, outside the queue's lock.
func (s *Scheduler) classSource(pid int32, asked Priority) classSource {
	if s.opts.PodPriority == nil {
		return classSource{asked: asked}
	}
	v, ok := s.opts.PodPriority(pid)
	return classSource{asked: asked, fromPod: true, value: v, known: ok}
}

// className names c's class.
func (q *queue) className(c *client) string {
	q.mu.Lock()
	defer q.mu.Unlock()
	return className(c.priority)
}
