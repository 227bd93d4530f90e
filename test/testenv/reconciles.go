package testenv

import (
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Reconciles is controller-runtime's count of the named controller's finished reconciles in this
// process. A test that checks that nothing happened waits for it to rise first: the controller looked.
func Reconciles(t testing.TB, controller string) float64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, f := range families {
		if f.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == controller {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}
