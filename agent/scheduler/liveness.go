package scheduler

// Liveness, the environment's policy and the bound in force (protocol version 6).
//
// A shim waiting for the GPU passes through, for good, after GPUSHARE_WAIT_TIMEOUT_MS without a
// grant. Waiting behind production that keeps the GPU without a gap is not a failure, so on a
// version 6 connection that timer counts only the scheduler's silence: every message restarts it,
// and a waiter asks (Ping) after a quarter of it in silence. The answer (Pong) is sent under the
// queue's lock, so a queue that is wedged does not answer and its waiters do pass through.
//
// A version 6 client's environment may not loosen its pacing and its waits (GPUSHARE_PACE_OVERRIDE
// and its siblings, docs/shim.md) unless Policy, right after Welcome, allows it. Only
// Options.EnvOverrides (the standalone scheduler, for benchmarks) sends it; the agent's schedulers
// never do, and the shim keeps its defaults where the environment would loosen them.
//
// The client reports the launch bound in force (Pacing) whenever it or its source changes: the
// scheduler's Pace, an override it allowed, a back-off after a stall, or none for good. ClientState
// carries it to the GPUNode status and gpusharing_scheduler_client_launch_bound.

// liveness: the client speaks protocol 6 (Ping, Policy, Pacing).
func (c *client) liveness() bool { return c.version == 0 || c.version >= 6 }

// pong answers a waiter's Ping.
func (q *queue) pong(c *client, seq uint32) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if c.state == stateGone {
		return
	}
	c.pings++
	q.sendLocked(c, Message{Type: MsgPong, Seq: seq})
}

// policyLocked sends a new client a Policy that allows the overrides where Options.EnvOverrides does
// (join: right after Welcome). Without one the client allows none: that is the agent's case, which
// costs its clients no message.
func (q *queue) policyLocked(c *client) {
	if !c.liveness() || !q.envOverrides {
		return
	}
	q.sendLocked(c, Message{Type: MsgPolicy, Flags: PolicyEnvOverrides})
}

// pacing records the launch bound a client reports in force; true when it or its source changed (the
// GPUNode status shows them: OnClientsChange).
func (q *queue) pacing(c *client, m Message) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if c.state == stateGone {
		return false
	}
	changed := !c.pacingKnown || c.paceInForce != m.MaxQueued || c.pacingState != m.Pacing
	if changed {
		q.log.V(1).Info("Shim client reports its launch bound", "client", c.id, "pid", c.pid,
			"bound", m.MaxQueued, "source", m.Pacing, "asked", c.pace)
	}
	c.pacingKnown, c.paceInForce, c.pacingState = true, m.MaxQueued, m.Pacing
	return changed
}
