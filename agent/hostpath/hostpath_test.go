package hostpath

import "testing"

// The layout is part of the node's contract (pods mount the pipe directory; docs name it): pin it.
func TestMPSLayoutIsRootUUIDPipeLogAndShm(t *testing.T) {
	if got := MPSPipeDir("/run/gpusharing/mps", "GPU-1"); got != "/run/gpusharing/mps/GPU-1/pipe" {
		t.Errorf("MPSPipeDir = %q, want /run/gpusharing/mps/GPU-1/pipe", got)
	}
	if got := MPSShmDir("/run/gpusharing/mps", "GPU-1"); got != "/run/gpusharing/mps/GPU-1/shm" {
		t.Errorf("MPSShmDir = %q, want /run/gpusharing/mps/GPU-1/shm", got)
	}
	if got := MPSLogDir("/run/gpusharing/mps", "GPU-1"); got != "/run/gpusharing/mps/GPU-1/log" {
		t.Errorf("MPSLogDir = %q, want /run/gpusharing/mps/GPU-1/log", got)
	}
}

// The scheduler socket's layout is shared by the agent's scheduler (where it listens) and the device
// plugin (what it mounts and names in GPUSHARE_SOCKET): pin it.
func TestSchedulerLayoutIsRootUUIDGpushareSock(t *testing.T) {
	if got := SchedulerSocket("/run/gpusharing/scheduler", "GPU-1"); got != "/run/gpusharing/scheduler/GPU-1/gpushare.sock" {
		t.Errorf("SchedulerSocket = %q, want /run/gpusharing/scheduler/GPU-1/gpushare.sock", got)
	}
	if got := SchedulerDir("/run/gpusharing/scheduler", "GPU-1"); got != "/run/gpusharing/scheduler/GPU-1" {
		t.Errorf("SchedulerDir = %q, want /run/gpusharing/scheduler/GPU-1", got)
	}
}
