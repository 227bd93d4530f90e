package dra_test

import (
	"testing"

	"github.com/gpusharing/gpusharing/agent/dra"
)

func TestGPUIndexReadsThePublishedNamesPrefix(t *testing.T) {
	for name, want := range map[string]int32{"gpu-0": 0, "gpu-12-mps-3": 12, "gpu-4-mig-0000-1": 4, "gpu-7-sized": 7} {
		if got, ok := dra.GPUIndex(name); !ok || got != want {
			t.Errorf("GPUIndex(%q) = %d, %v; want %d", name, got, ok, want)
		}
	}
	for _, name := range []string{"", "gpu-", "gpu-x", "gpu--1", "gpu-01", "cpu-0"} {
		if _, ok := dra.GPUIndex(name); ok {
			t.Errorf("GPUIndex(%q) accepted", name)
		}
	}
}
