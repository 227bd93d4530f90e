package prom

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
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
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
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
