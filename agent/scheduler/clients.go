package scheduler

// Clients returns the connected clients of one GPU, ordered by client id: what the agent's unmanaged
// check (agent/guard) compares NVML's processes with, by pid.
func (s *Scheduler) Clients(gpu string) []ClientState {
	for _, q := range s.queues {
		if q.uuid == gpu {
			return q.snapshot()
		}
	}
	return nil
}
