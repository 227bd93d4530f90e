package scheduler

import "github.com/go-logr/logr"

// priorityFor is the priority a client runs at: what its hello asks, but never above what its pod
// allows (Options.PeerPriority). The hello comes from the process's environment (GPUSHARE_PRIORITY),
// which the pod's own code controls, so on its own it would let any process put itself ahead of every
// other tenant; the pod's spec is written through the API server, under its admission rules.
func (s *Scheduler) priorityFor(log logr.Logger, pid int32, asked Priority) Priority {
	if s.opts.PeerPriority == nil {
		return asked
	}
	allowed := s.opts.PeerPriority(pid)
	if asked > allowed {
		log.Info("Lowering the priority a shim client asked for to what its pod allows", "pid", pid,
			"asked", asked, "allowed", allowed)
		return allowed
	}
	return asked
}
