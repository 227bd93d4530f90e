package v1alpha1

import (
	"slices"
	"testing"
)

func TestHardwareRejectionReasonsAreTheReasonsIsHardwareRejectionAccepts(t *testing.T) {
	got := HardwareRejectionReasons()
	if !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
		t.Errorf("HardwareRejectionReasons() = %v, want sorted without duplicates", got)
	}
	for _, r := range got {
		if !IsHardwareRejection(r) {
			t.Errorf("IsHardwareRejection(%q) = false for a listed reason", r)
		}
	}
	// Work in progress is never a rejection.
	for _, r := range []string{ReasonAsDesired, ReasonApplying, ReasonGPUBusy, ReasonDraining, ReasonNotDesired, ""} {
		if IsHardwareRejection(r) {
			t.Errorf("IsHardwareRejection(%q) = true, want false: the GPU is still being worked on", r)
		}
	}
	// The list handed out is a copy.
	got[0] = "Changed"
	if IsHardwareRejection("Changed") {
		t.Error("changing the returned list changed the rejections")
	}
}
