package scheduler

import "github.com/prometheus/client_golang/prometheus"

// metrics are the scheduler's Prometheus series, labelled by GPU uuid.
type metrics struct {
	wait        *prometheus.HistogramVec
	hold        *prometheus.HistogramVec
	handoffs    *prometheus.CounterVec
	revocations *prometheus.CounterVec
	clients     *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	buckets := prometheus.ExponentialBuckets(0.0001, 4, 12) // 100 us .. ~7 min
	m := &metrics{
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gpusharing_scheduler_wait_seconds",
			Help:    "Time from a client's acquire to its grant, per GPU.",
			Buckets: buckets,
		}, []string{"gpu"}),
		hold: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gpusharing_scheduler_hold_seconds",
			Help:    "Time a client held the GPU lock, per GPU (ended by release, revocation or disconnect).",
			Buckets: buckets,
		}, []string{"gpu"}),
		handoffs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpusharing_scheduler_handoffs_total",
			Help: "Times the GPU lock passed to a waiting client, per GPU.",
		}, []string{"gpu"}),
		revocations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpusharing_scheduler_revocations_total",
			Help: "Times a holder was revoked for keeping the lock past quantum plus grace, per GPU.",
		}, []string{"gpu"}),
		clients: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpusharing_scheduler_clients",
			Help: "Connected shim clients, per GPU.",
		}, []string{"gpu"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.wait, m.hold, m.handoffs, m.revocations, m.clients} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}
