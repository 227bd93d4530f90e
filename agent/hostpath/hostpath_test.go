package hostpath

import "testing"

// The layout is part of the node's contract (pods mount the pipe directory; docs name it): pin it.
func TestMPSLayoutIsRootUUIDPipeAndLog(t *testing.T) {
	if got := MPSPipeDir("/run/gpusharing/mps", "GPU-1"); got != "/run/gpusharing/mps/GPU-1/pipe" {
		t.Errorf("MPSPipeDir = %q, want /run/gpusharing/mps/GPU-1/pipe", got)
	}
	if got := MPSLogDir("/run/gpusharing/mps", "GPU-1"); got != "/run/gpusharing/mps/GPU-1/log" {
		t.Errorf("MPSLogDir = %q, want /run/gpusharing/mps/GPU-1/log", got)
	}
}
