package promreg

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestASecondRegistrationSharesTheFirstCollector(t *testing.T) {
	reg := prometheus.NewRegistry()
	opts := prometheus.GaugeOpts{Name: "gpusharing_promreg_test", Help: "test"}
	first, err := Register(reg, prometheus.NewGauge(opts))
	if err != nil {
		t.Fatal(err)
	}
	second, err := Register(reg, prometheus.NewGauge(opts))
	if err != nil {
		t.Fatalf("second registration: %v", err)
	}
	if second != first {
		t.Error("the second registration did not return the collector already registered")
	}
}

func TestAConflictingRegistrationFails(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{Name: "gpusharing_promreg_test", Help: "a"})); err != nil {
		t.Fatal(err)
	}
	// Same name, other help: the registry refuses it as inconsistent, not as already registered.
	if _, err := Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{Name: "gpusharing_promreg_test", Help: "b"})); err == nil {
		t.Error("a collector that conflicts with a registered one was accepted")
	}
}

func TestANilRegistryRegistersNothing(t *testing.T) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "gpusharing_promreg_test", Help: "test"})
	if got, err := Register[prometheus.Gauge](nil, g); err != nil || got != g {
		t.Errorf("Register(nil) = %v, %v; want the collector back", got, err)
	}
}
