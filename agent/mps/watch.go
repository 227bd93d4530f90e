package mps

import (
	"context"
	"time"

	"github.com/go-logr/logr"
)

// stableAfter is how long a daemon must stay up before its restart backoff starts over.
const stableAfter = 5 * time.Minute

// Run watches the daemons until ctx ends (a controller-runtime Runnable).
func (m *Manager) Run(ctx context.Context) error {
	t := m.cfg.Clock.NewTicker(m.cfg.WatchInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
			m.Check(ctx)
		}
	}
}

// Check is one watch pass: a dead daemon is marked Restarting and restarted once its backoff has
// passed (1s, 2s, 4s ... up to BackoffMax); the client counts of live daemons are refreshed.
func (m *Manager) Check(ctx context.Context) {
	m.ops.Lock()
	defer m.ops.Unlock()
	log := logr.FromContextOrDiscard(ctx)
	m.mu.Lock()
	daemons := make([]*daemon, 0, len(m.daemons))
	for _, d := range m.daemons {
		daemons = append(daemons, d)
	}
	m.mu.Unlock()

	for _, d := range daemons {
		m.mu.Lock()
		k, pid, state, settings := d.key, d.pid, d.state, d.settings
		m.mu.Unlock()
		now := m.cfg.Clock.Now()

		switch state {
		case StateRunning:
			if alive, err := m.alive(pid); err == nil && !alive {
				log.Info("MPS daemon died", "gpu", k.gpu, "namespace", k.ns, "pid", pid)
				m.mu.Lock()
				if now.Sub(d.startedAt) >= stableAfter {
					d.backoff = 0
				}
				d.backoff = nextBackoff(d.backoff, m.cfg.BackoffInitial, m.cfg.BackoffMax)
				d.nextStart = now.Add(d.backoff)
				d.state, d.pid, d.clients = StateRestarting, 0, 0
				d.lastErr = "the daemon exited"
				m.mu.Unlock()
				m.notify(k.gpu)
				continue
			}
			n, err := m.clients(ctx, k)
			if err != nil {
				continue // a daemon that stopped answering is caught dead by the next check
			}
			m.mu.Lock()
			changed := n != d.clients
			d.clients = n
			m.mu.Unlock()
			if changed {
				m.notify(k.gpu)
			}
		case StateRestarting, StateFailed:
			m.mu.Lock()
			due := !now.Before(d.nextStart)
			m.mu.Unlock()
			if !due {
				continue
			}
			m.mu.Lock()
			d.restarts++
			restarts := d.restarts
			m.mu.Unlock()
			log.Info("Restarting MPS daemon", "gpu", k.gpu, "namespace", k.ns, "restarts", restarts)
			if _, err := m.start(ctx, d, settings); err != nil {
				log.Error(err, "Restarting MPS daemon failed", "gpu", k.gpu, "namespace", k.ns)
			}
			m.notify(k.gpu)
		}
	}
}

func (m *Manager) notify(uuid string) {
	if m.cfg.Notify != nil {
		m.cfg.Notify(uuid)
	}
}
