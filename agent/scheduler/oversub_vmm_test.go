package scheduler

import (
	"strings"
	"testing"
	"time"
)

// Work still queued on the GPU when memory is unmapped. The driver's
// cuMemUnmap does not wait for it (PyTorch synchronizes its stream before
// unmapping an expandable segment for that reason), so the unmapper must:
// the application before it shrinks a segment, the shim before a swap-out
// takes the application's mappings away. The stub's worker here starts every
// item 500 µs late, as when the CPUs are starved, and the stub aborts on an
// unmap that queued work still uses, so a missing wait fails every run
// instead of one run in six under load. Each client launches a kernel over a
// VMM buffer right before it shrinks the buffer, and two of them swap against
// each other.
func TestOversubVMMUnmapWaitsForQueuedWorkOnASlowGPU(t *testing.T) {
	const budget = 16 * mib
	e := newMemEnv(t, 5*time.Millisecond, 200*time.Millisecond, budget, ModeAuto)
	env := []string{"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "GPUSHARE_STUB_WORKER_DELAY_US=500"}
	args := []string{"alloc=vmm", "bufs=3", "size=4194304", "small=8", "iters=200", "sleep_us=20",
		"verify_every=50"}
	a := e.startOversub(env, append(args, "seed=3")...)
	b := e.startOversub(env, append(args, "seed=4")...)
	va := a.waitOversub(t, 120*time.Second)
	vb := b.waitOversub(t, 120*time.Second)
	t.Logf("swaps: a out=%d in=%d, b out=%d in=%d; churned %d and %d", va["swap_out"], va["swap_in"],
		vb["swap_out"], vb["swap_in"], va["churned"], vb["churned"])
	if va["churned"] == 0 || vb["churned"] == 0 {
		t.Errorf("no segment was unmapped and mapped again: %v %v", va, vb)
	}
	if va["swap_out"]+vb["swap_out"] == 0 {
		t.Error("no swapping happened")
	}
	for _, p := range []*proc{a, b} {
		if strings.Contains(p.stderr.String(), "stub driver:") {
			t.Errorf("the stub saw a misuse:\n%s", p.stderr.String())
		}
	}
}
