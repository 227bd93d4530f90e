package scheduler

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestNewMetricsOnARegistryThatHasThemReturnsTheRegisteredOnes(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewMetrics(reg)
	if err != nil {
		t.Fatalf("a second agent of the process: %v", err)
	}
	if a != b {
		t.Error("the second agent got unregistered metrics: its schedulers' series would never be exported")
	}
}
