package scheduler

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// NewMetrics registers the scheduler's series on reg (nil: unregistered), for
// Schedulers that share them through Options.Metrics. When reg holds them
// already (another agent of the process), it returns the Metrics registered.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m, err := newMetrics(reg)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(*memCollector); ok {
			return existing.m, nil
		}
	}
	return m, err
}

// Metrics are the scheduler's Prometheus series, labelled by GPU uuid, and the
// Schedulers whose memory accounts its collector reads at each scrape. One
// Metrics may serve several Schedulers (Options.Metrics): the node agent runs
// one Scheduler per GPU and several agents may share a process (the demo), but
// a registry takes each series only once.
type Metrics struct {
	wait        *prometheus.HistogramVec
	hold        *prometheus.HistogramVec
	handoffs    *prometheus.CounterVec
	revocations *prometheus.CounterVec
	preemptions *prometheus.CounterVec
	// stalls counts holders revoked because their process was stopped while others waited (stall.go).
	stalls    *prometheus.CounterVec
	evictions *prometheus.CounterVec
	clients   *prometheus.GaugeVec
	// refused and dropped count connections turned away and clients cut off by the limits (limits.go);
	// underReports counts reports NVML contradicted (memcheck.go).
	refused      *prometheus.CounterVec
	dropped      *prometheus.CounterVec
	underReports *prometheus.CounterVec
	// gangs, gangTurns and gangWait are the gangs' (gang.go), by gang key, dropped when a gang dissolves.
	gangs     prometheus.Gauge
	gangTurns *prometheus.CounterVec
	gangWait  *prometheus.CounterVec

	mu     sync.Mutex
	scheds map[*Scheduler]struct{}
}

func newMetrics(reg prometheus.Registerer) (*Metrics, error) {
	buckets := prometheus.ExponentialBuckets(0.0001, 4, 12) // 100 us .. ~7 min
	m := &Metrics{
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
		preemptions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpusharing_scheduler_preemptions_total",
			Help: "Times an opportunistic holder was revoked at once because a production client asked for the GPU, per GPU.",
		}, []string{"gpu"}),
		stalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpusharing_scheduler_stall_revocations_total",
			Help: "Times a holder whose process was stopped (a stop signal, a debugger) was revoked while others waited, per GPU.",
		}, []string{"gpu"}),
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpusharing_scheduler_evictions_total",
			Help: "Times a client that was not running was asked to swap memory out for another, per GPU.",
		}, []string{"gpu"}),
		clients: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpusharing_scheduler_clients",
			Help: "Connected shim clients, per GPU.",
		}, []string{"gpu"}),
		gangs: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpusharing_scheduler_gangs",
			Help: "Gangs formed: owners (a pod, or a session on the standalone scheduler) with shim clients on two or more GPUs.",
		}),
		gangTurns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpusharing_scheduler_gang_turns_total",
			Help: "Turns a gang took on all its GPUs at once, by gang and how the turn ended (idle, quantum, preempted, member_left, member_joined, stalled).",
		}, []string{"gang", "end"}),
		gangWait: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpusharing_scheduler_gang_wait_seconds_total",
			Help: "Time a gang waited from its first member's request to its turn's start, summed over its turns, by gang.",
		}, []string{"gang"}),
		scheds: map[*Scheduler]struct{}{},
	}
	m.refused, m.dropped, m.underReports = newGuardMetrics()
	if reg == nil {
		return m, nil
	}
	// The per-client memory series are read from the schedulers' snapshots at each scrape, so a
	// client's series vanish when it leaves. The memory collector goes first, so NewMetrics can tell
	// series another agent of the process registered.
	for _, c := range []prometheus.Collector{&memCollector{m: m}, &ledgerCollector{m: m}, m.wait, m.hold, m.handoffs, m.revocations, m.preemptions, m.stalls, m.evictions, m.clients, m.refused, m.dropped, m.underReports, m.gangs, m.gangTurns, m.gangWait} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Metrics) attach(s *Scheduler) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.scheds[s] = struct{}{}
}

func (m *Metrics) detach(s *Scheduler) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.scheds, s)
}

func (m *Metrics) attached() []*Scheduler {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*Scheduler, 0, len(m.scheds))
	for s := range m.scheds {
		out = append(out, s)
	}
	return out
}

// Forget drops a GPU's series, for a GPU whose scheduler stopped for good: its
// last values would otherwise be exported for as long as the process lives.
func (m *Metrics) Forget(gpu string) {
	for _, v := range []interface{ DeleteLabelValues(...string) bool }{m.wait, m.hold, m.handoffs, m.revocations, m.preemptions, m.stalls, m.evictions, m.clients} {
		v.DeleteLabelValues(gpu)
	}
	m.refused.DeletePartialMatch(prometheus.Labels{"gpu": gpu})
	m.dropped.DeletePartialMatch(prometheus.Labels{"gpu": gpu})
	m.underReports.DeleteLabelValues(gpu)
}

var (
	clientLabels   = []string{"gpu", "client", "pid"}
	descBudget     = prometheus.NewDesc("gpusharing_scheduler_budget_bytes", "Device memory the shim clients of a GPU may have resident together.", []string{"gpu"}, nil)
	descReserved   = prometheus.NewDesc("gpusharing_scheduler_reserved_bytes", "Sum of the clients' memory reservations on a GPU (never above the budget).", []string{"gpu"}, nil)
	descPeak       = prometheus.NewDesc("gpusharing_scheduler_reserved_peak_bytes", "Highest sum of reservations on a GPU since the scheduler started.", []string{"gpu"}, nil)
	descResident   = prometheus.NewDesc("gpusharing_scheduler_client_resident_bytes", "Device memory a client has resident, as it last reported.", clientLabels, nil)
	descSwapped    = prometheus.NewDesc("gpusharing_scheduler_client_swapped_bytes", "Memory of a client swapped out to host staging, as it last reported.", clientLabels, nil)
	descSwaps      = prometheus.NewDesc("gpusharing_scheduler_client_swaps_total", "Allocations a client swapped, by direction (out, in).", append(clientLabels, "direction"), nil)
	descSwapBytes  = prometheus.NewDesc("gpusharing_scheduler_client_swap_bytes_total", "Bytes a client copied while swapping, by direction (out, in).", append(clientLabels, "direction"), nil)
	descSwapSecond = prometheus.NewDesc("gpusharing_scheduler_client_swap_seconds_total", "Time a client spent swapping.", clientLabels, nil)
	// descLaunchBound: only for clients of protocol 6, which report it (liveness.go).
	descLaunchBound = prometheus.NewDesc("gpusharing_scheduler_client_launch_bound",
		"Launches a client keeps outstanding at most, as it reports the bound in force (0: unbounded), by its source (Scheduler, Override, Backoff, Off).",
		[]string{"gpu", "client", "pid", "source"}, nil)
)

type memCollector struct{ m *Metrics }

func (c *memCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descBudget, descReserved, descPeak, descResident, descSwapped, descSwaps, descSwapBytes, descSwapSecond, descLaunchBound} {
		ch <- d
	}
}

func (c *memCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.m.attached() {
		c.collect(s, ch)
	}
}

func (c *memCollector) collect(s *Scheduler, ch chan<- prometheus.Metric) {
	for _, g := range s.GPUs() {
		ch <- prometheus.MustNewConstMetric(descBudget, prometheus.GaugeValue, float64(g.Budget), g.GPU)
		ch <- prometheus.MustNewConstMetric(descReserved, prometheus.GaugeValue, float64(g.ReservedBytes), g.GPU)
		ch <- prometheus.MustNewConstMetric(descPeak, prometheus.GaugeValue, float64(g.PeakReservedBytes), g.GPU)
	}
	for _, cs := range s.Snapshot() {
		l := []string{cs.GPU, itoa(uint64(cs.ID)), itoa(uint64(cs.PID))}
		ch <- prometheus.MustNewConstMetric(descResident, prometheus.GaugeValue, float64(cs.ResidentBytes), l...)
		ch <- prometheus.MustNewConstMetric(descSwapped, prometheus.GaugeValue, float64(cs.SwappedBytes), l...)
		ch <- prometheus.MustNewConstMetric(descSwaps, prometheus.CounterValue, float64(cs.SwapOuts), append(l, "out")...)
		ch <- prometheus.MustNewConstMetric(descSwaps, prometheus.CounterValue, float64(cs.SwapIns), append(l, "in")...)
		ch <- prometheus.MustNewConstMetric(descSwapBytes, prometheus.CounterValue, float64(cs.BytesOut), append(l, "out")...)
		ch <- prometheus.MustNewConstMetric(descSwapBytes, prometheus.CounterValue, float64(cs.BytesIn), append(l, "in")...)
		ch <- prometheus.MustNewConstMetric(descSwapSecond, prometheus.CounterValue, cs.SwapTime.Seconds(), l...)
		if cs.PacingKnown {
			ch <- prometheus.MustNewConstMetric(descLaunchBound, prometheus.GaugeValue, float64(cs.LaunchBound),
				append(l[:3:3], cs.PacingState.String())...)
		}
	}
}

// forgetGang drops a dissolved gang's series.
func (m *Metrics) forgetGang(key string) {
	m.gangTurns.DeletePartialMatch(prometheus.Labels{"gang": key})
	m.gangWait.DeleteLabelValues(key)
}

func itoa(v uint64) string {
	if v == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for v > 0 {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
	}
	return string(b[i:])
}
