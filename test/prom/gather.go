package prom

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Gathered reads g's gauges and counters as "name{namespace/pod,<third>,gpu,node}" -> value, the key the
// per-pod series' tests compare: third is the label that tells one pod's series apart (container for
// the accounting's, claim for the sized claims').
func Gathered(t testing.TB, g prometheus.Gatherer, third string) map[string]float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			l := labelsOf(m)
			key := fmt.Sprintf("%s{%s/%s,%s,%s,%s}", mf.GetName(), l["namespace"], l["pod"], l[third], l["gpu"], l["node"])
			switch {
			case m.GetGauge() != nil:
				out[key] = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				out[key] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// Find reads the first gauge or counter named name among g's series whose labels include every one of
// labels; found is false where none does.
func Find(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) (v float64, found bool) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			l := labelsOf(m)
			for k, want := range labels {
				if l[k] != want {
					continue series
				}
			}
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue(), true
			}
			return m.GetCounter().GetValue(), true
		}
	}
	return 0, false
}

func labelsOf(m *dto.Metric) map[string]string {
	l := map[string]string{}
	for _, lp := range m.GetLabel() {
		l[lp.GetName()] = lp.GetValue()
	}
	return l
}

// CounterValue reads one counter, as client_golang's testutil would without the dependencies that
// package brings, which this module does not carry.
func CounterValue(t testing.TB, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// GaugeValue reads one gauge as CounterValue reads a counter.
func GaugeValue(t testing.TB, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}
