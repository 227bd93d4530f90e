package scheduler

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpusharing/gpusharing/test/wait"
)

// Oversubscription end to end: real processes (shim/tests/oversub_client)
// under the shim, on the stub driver, whose device memory is host memory.
// Every client keeps a host mirror of its buffers and fails on the first
// byte that differs, so these tests check data integrity across swaps, not
// just bookkeeping.

// newMemEnv starts a scheduler with a memory budget.
func newMemEnv(t *testing.T, quantum, grace time.Duration, budget uint64, mode Mode) *env {
	t.Helper()
	return startEnv(t, GPUConfig{Quantum: quantum, Grace: grace, Budget: budget, Mode: mode})
}

func (e *env) memtrace() string { return filepath.Join(e.dir, "memtrace") }

// startOversub runs oversub_client under the shim with oversubscription on.
func (e *env) startOversub(extraEnv []string, args ...string) *proc {
	e.t.Helper()
	return e.startProgram("oversub_client", append([]string{
		"GPUSHARE_OVERSUB=1",
		"GPUSHARE_LOG_LEVEL=info",
		"GPUSHARE_STUB_LAUNCH_US=0",
		"GPUSHARE_STUB_MEMTRACE=" + e.memtrace(),
	}, extraEnv...), args...)
}

// gate is a file a client waits for (its hold_until= or idle_until= option): it idles until the test
// has seen what it checks, however long that takes on a loaded machine. open creates the file.
func (e *env) gate(name string) (path string, open func()) {
	path = filepath.Join(e.dir, name)
	return path, func() {
		if err := os.WriteFile(path, nil, 0o644); err != nil {
			e.t.Fatal(err)
		}
	}
}

// idleThenNewcomer starts a client, waits until it prints ready (then it
// idles, holding its memory, until release), then starts a newcomer and waits
// until that one finished its work (it too idles until release).
func (e *env) idleThenNewcomer(t *testing.T, first []string, ready string, newcomer []string) (a, b *proc, release func()) {
	t.Helper()
	held, release := e.gate("release")
	idle := "hold_until=" // idle after the work, holding the memory
	if ready == "oversub freed" {
		idle = "idle_until=" // idle after freeing it
	}
	first = append(first, idle+held)
	newcomer = append(newcomer, "hold_until="+held)
	a = e.startOversub(nil, first...)
	wait.Until(t, 5*time.Second, func() bool {
		return strings.Contains(a.stdout.String(), ready)
	}, "the first client: %s", ready)
	b = e.startOversub(nil, newcomer...)
	wait.Until(t, 5*time.Second, func() bool {
		return strings.Contains(b.stdout.String(), "oversub done")
	}, "the newcomer finished its work")
	return a, b, release
}

// oversubPair runs two clients with the same environment and arguments (seeds 1 and 2) and waits for
// both to finish their work with correct data; it returns each one's values.
func (e *env) oversubPair(t *testing.T, d time.Duration, extraEnv []string, args ...string) (*proc, *proc, map[string]int64, map[string]int64) {
	t.Helper()
	a := e.startOversub(extraEnv, append(args, "seed=1")...)
	b := e.startOversub(extraEnv, append(args, "seed=2")...)
	return a, b, a.waitOversub(t, d), b.waitOversub(t, d)
}

// waitOversub fails the test unless the client finished its work with correct data.
func (p *proc) waitOversub(t *testing.T, d time.Duration) map[string]int64 {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		t.Fatalf("client %d still running after %v; stdout:\n%s\nstderr:\n%s", p.pid(), d, p.stdout.String(), p.stderr.String())
	}
	if p.err != nil || !strings.Contains(p.stdout.String(), "oversub done") {
		t.Fatalf("client %d failed: %v\nstdout:\n%s\nstderr:\n%s", p.pid(), p.err, p.stdout.String(), p.stderr.String())
	}
	return p.values()
}

var kv = regexp.MustCompile(`([a-z_]+)=(-?[0-9]+)`)

// values collects key=number pairs from the client's "oversub" lines and the shim's swap stats.
func (p *proc) values() map[string]int64 {
	out := map[string]int64{}
	for _, line := range strings.Split(p.stdout.String()+p.stderr.String(), "\n") {
		if !strings.Contains(line, "oversub") && !strings.Contains(line, "swap stats") {
			continue
		}
		prefix := ""
		if strings.Contains(line, "swap stats") {
			prefix = "swap_"
		}
		for _, m := range kv.FindAllStringSubmatch(line, -1) {
			v, _ := strconv.ParseInt(m[2], 10, 64)
			out[prefix+m[1]] = v
		}
	}
	return out
}

// peakPhysical replays the stub's record of physical allocations of every
// process (logged before creating, after releasing) and returns the highest
// total resident at any moment.
func (e *env) peakPhysical() int64 {
	e.t.Helper()
	f, err := os.Open(e.memtrace())
	if err != nil {
		e.t.Fatal(err)
	}
	defer f.Close()
	type ev struct{ ns, delta int64 }
	var evs []ev
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) != 4 || fs[0] != "M" {
			continue
		}
		ns, _ := strconv.ParseInt(fs[2], 10, 64)
		d, _ := strconv.ParseInt(fs[3], 10, 64)
		evs = append(evs, ev{ns, d})
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].ns < evs[j].ns })
	var cur, peak int64
	for _, x := range evs {
		cur += x.delta
		peak = max(peak, cur)
	}
	return peak
}

// Two processes whose working sets add up to 1.5x the budget both finish with
// every byte right, after thousands of swaps, and the physical memory of the
// two never exceeded the budget (from the stub's own record and from the
// scheduler's account).
// Both as five 2 MiB allocations and as one 10 MiB allocation in 2 MiB segments (each evicted and
// brought back on its own).
func TestOversubTwoClientsOverBudgetKeepEveryByteAcrossThousandsOfSwaps(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  []string
		bufs []string
	}{
		{"allocations", nil, []string{"bufs=5", "size=2097152"}},
		{"segments", []string{"GPUSHARE_SEGMENT_MIB=2"}, []string{"bufs=1", "size=" + strconv.Itoa(10*mib)}},
	} {
		t.Run(tc.name, func(t *testing.T) { twoClientsOverBudget(t, tc.env, tc.bufs) })
	}
}

func twoClientsOverBudget(t *testing.T, env, bufs []string) {
	const budget = 16 * mib // each client: 10 MiB + one 2 MiB slab = 12 MiB; together 24 MiB
	e := newMemEnv(t, 5*time.Millisecond, 200*time.Millisecond, budget, ModeAuto)
	args := append(append([]string{}, bufs...), "small=8", "iters=2500", "sleep_us=20", "verify_every=250")
	a := e.startOversub(env, append(args, "seed=1")...)
	b := e.startOversub(env, append(args, "seed=2")...)
	var peakReserved uint64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !a.exited() || !b.exited() {
			for _, g := range e.s.GPUs() {
				peakReserved = max(peakReserved, g.ReservedBytes)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	va := a.waitOversub(t, 120*time.Second)
	vb := b.waitOversub(t, 120*time.Second)
	<-done
	swaps := va["swap_out"] + va["swap_in"] + vb["swap_out"] + vb["swap_in"]
	t.Logf("swaps: a out=%d in=%d, b out=%d in=%d; verified %d and %d ranges", va["swap_out"], va["swap_in"],
		vb["swap_out"], vb["swap_in"], va["verified"], vb["verified"])
	if swaps < 1000 {
		t.Errorf("only %d swaps; the test wants thousands", swaps)
	}
	// Hand-offs overlap (protocol 3): swap-ins that mapped memory as the other's eviction freed it.
	t.Logf("overlapped swap-ins: a %d, b %d", va["swap_overlapped"], vb["swap_overlapped"])
	if va["swap_overlapped"]+vb["swap_overlapped"] == 0 {
		t.Errorf("no swap-in overlapped the other process's swap-out")
	}
	if p := e.peakPhysical(); p > budget || p == 0 {
		t.Errorf("physical memory of both processes peaked at %d bytes, budget %d", p, budget)
	}
	g := e.s.GPUs()[0]
	if g.PeakReservedBytes > budget || peakReserved > budget {
		t.Errorf("scheduler account peaked at %d (sampled %d), budget %d", g.PeakReservedBytes, peakReserved, budget)
	}
	if va["range_ok"] != 1 || va["ctx_ok"] != 1 || va["total"] != budget || va["ipc"] != 801 {
		t.Errorf("driver answers on swappable memory: %v (want range_ok=1 ctx_ok=1 total=budget ipc=801)", va)
	}
	if !strings.Contains(a.stderr.String(), "cuIpcGetMemHandle") {
		t.Errorf("no log line saying why legacy IPC failed:\n%s", a.stderr.String())
	}
}

// A releasing process keeps what the next one does not need: the newcomer
// needing 8 MiB of a 16 MiB budget next to a 12 MiB idle process takes 4 MiB
// of it, not all 12 (as it grows, allocation by allocation).
func TestOversubEvictsOnlyWhatTheNextHolderNeeds(t *testing.T) {
	const budget = 16 * mib
	e := newMemEnv(t, 50*time.Millisecond, 200*time.Millisecond, budget, ModeAuto)
	a, b, release := e.idleThenNewcomer(t, []string{"bufs=5", "size=2097152", "small=0", "iters=50"},
		"oversub done", []string{"bufs=3", "size=2097152", "small=0", "iters=50", "seed=3"})
	sa, _ := e.state(a.pid())
	sb, _ := e.state(b.pid())
	t.Logf("a: need %d resident %d swapped %d outs %d; b: need %d resident %d", sa.NeedBytes, sa.ResidentBytes,
		sa.SwappedBytes, sa.SwapOuts, sb.NeedBytes, sb.ResidentBytes)
	if sa.NeedBytes != 12*mib || sb.NeedBytes != 8*mib {
		t.Fatalf("needs a=%d b=%d, want 12 and 8 MiB", sa.NeedBytes, sb.NeedBytes)
	}
	if sa.ResidentBytes != 8*mib || sa.SwappedBytes != 4*mib || sa.SwapOuts != 2 {
		t.Errorf("a keeps %d resident, %d swapped, %d swap-outs; want 8 MiB kept, 4 MiB (two allocations) out",
			sa.ResidentBytes, sa.SwappedBytes, sa.SwapOuts)
	}
	if sa.ReservedBytes+sb.ReservedBytes > budget || sa.Evictions == 0 || sb.ResidentBytes != 8*mib {
		t.Errorf("reservations a=%d b=%d (budget %d), evictions of a = %d, b resident %d", sa.ReservedBytes,
			sb.ReservedBytes, budget, sa.Evictions, sb.ResidentBytes)
	}
	release()
	a.waitOversub(t, 10*time.Second)
	b.waitOversub(t, 10*time.Second)
}

// A large allocation leaves only in part: an idle process with one 12 MiB allocation (in 2 MiB
// segments) next to a newcomer 8 MiB short on a 16 MiB budget gives up 8 MiB of it, not all 12 (on the
// H100 a 5.75 GiB ballast left whole where 4.4 GB would do). Its next grant brings back only the
// missing segments, and every byte of the allocation is right afterwards; pointer queries still
// answer for the whole allocation.
func TestOversubEvictsPartOfALargeAllocation(t *testing.T) {
	const budget = 16 * mib
	e := newMemEnv(t, 50*time.Millisecond, 200*time.Millisecond, budget, ModeAuto)
	seg := []string{"GPUSHARE_SEGMENT_MIB=2"}
	// a idles until b is gone; b until its state was read.
	heldA, releaseA := e.gate("release-a")
	heldB, releaseB := e.gate("release-b")
	a := e.startOversub(seg, "bufs=1", "size="+strconv.Itoa(12*mib), "small=0", "iters=50", "hold_until="+heldA,
		"recheck=1")
	wait.Until(t, 5*time.Second, func() bool {
		return strings.Contains(a.stdout.String(), "oversub done")
	}, "the first client finished its work")
	b := e.startOversub(seg, "bufs=1", "size="+strconv.Itoa(8*mib), "small=0", "iters=50", "seed=3", "hold_until="+heldB)
	wait.Until(t, 5*time.Second, func() bool {
		return strings.Contains(b.stdout.String(), "oversub done")
	}, "the newcomer finished its work")
	sa, _ := e.state(a.pid())
	sb, _ := e.state(b.pid())
	// Each also has a 2 MiB slab (the client's small allocations): a needs 14 MiB, b 10 MiB, so b's
	// grant is 8 MiB short: four segments, where the whole 12 MiB would have left unsplit.
	deficit := sb.NeedBytes - (budget - sa.NeedBytes)
	t.Logf("a: need %d resident %d swapped %d outs %d; b: need %d", sa.NeedBytes, sa.ResidentBytes, sa.SwappedBytes,
		sa.SwapOuts, sb.NeedBytes)
	if sa.NeedBytes != 14*mib || sb.NeedBytes != 10*mib || sa.SwappedBytes != deficit || sa.SwapOuts != 4 {
		t.Errorf("a: %d swapped in %d swap-outs; want the %d bytes b lacked, in 2 MiB segments", sa.SwappedBytes,
			sa.SwapOuts, deficit)
	}
	releaseB()
	b.waitOversub(t, 10*time.Second)
	releaseA()
	va := a.waitOversub(t, 10*time.Second)
	if !strings.Contains(a.stdout.String(), "oversub rechecked") || va["range_ok"] != 1 || va["ctx_ok"] != 1 {
		t.Errorf("a did not check its memory after the hold, or its pointer answers were off: %v\n%s", va,
			a.stdout.String())
	}
	if va["swap_in"] != 4 {
		t.Errorf("a swapped in %d segments, want the 4 that left", va["swap_in"])
	}
}

// A process that holds its memory while a stream captures cannot be
// synchronized, so its eviction waits for the capture to end; the newcomer
// gets the memory only then, and nothing was synchronized during the capture.
func TestOversubEvictionWaitsForAStreamCapture(t *testing.T) {
	const budget = 16 * mib
	e := newMemEnv(t, 20*time.Millisecond, 50*time.Millisecond, budget, ModeAuto)
	a := e.startOversub(nil, "bufs=5", "size=2097152", "small=0", "iters=30", "capture_ms=700")
	wait.Until(t, 5*time.Second, func() bool {
		return strings.Contains(a.stdout.String(), "capture_begin_ns")
	}, "the first client captures")
	b := e.startOversub(nil, "bufs=3", "size=2097152", "small=0", "iters=30", "seed=5")
	va := a.waitOversub(t, 20*time.Second)
	vb := b.waitOversub(t, 20*time.Second)
	if vb["allocated_ns"] <= va["capture_end_ns"] {
		t.Errorf("the newcomer had its memory %d ns before the capture ended", va["capture_end_ns"]-vb["allocated_ns"])
	}
	if n := e.readTrace().syncInCapt; n != 0 {
		t.Errorf("the shim synchronized %d times while a stream captured", n)
	}
	if va["swap_out"] == 0 {
		t.Errorf("the capturing client never gave memory up: %v", va)
	}
	if p := e.peakPhysical(); p > budget {
		t.Errorf("physical memory peaked at %d bytes, budget %d", p, budget)
	}
}

// An allocation larger than the whole budget fails with out-of-memory and a
// log line that says why; the process goes on.
func TestOversubAllocationLargerThanTheBudgetFailsWithOutOfMemory(t *testing.T) {
	const budget = 16 * mib
	e := newMemEnv(t, 50*time.Millisecond, 200*time.Millisecond, budget, ModeAuto)
	a := e.startOversub(nil, "bufs=1", "size=2097152", "small=2", "iters=20", "big="+strconv.Itoa(budget+1))
	va := a.waitOversub(t, 10*time.Second)
	if va["big"] != 2 || !strings.Contains(a.stderr.String(), "more than this GPU's whole budget") {
		t.Errorf("oversized allocation: result %d, want 2 (CUDA_ERROR_OUT_OF_MEMORY) and a reason:\n%s", va["big"], a.stderr.String())
	}
}

// GPUSHARE_BUDGET_BYTES makes a per-process budget real: cuMemGetInfo reports
// it, and a working set beyond it fails to grow (out of memory, with a reason).
func TestOversubPerProcessBudgetCapsTheWorkingSet(t *testing.T) {
	e := newMemEnv(t, 50*time.Millisecond, 200*time.Millisecond, 64*mib, ModeAuto)
	a := e.startOversub([]string{"GPUSHARE_BUDGET_BYTES=" + strconv.Itoa(8*mib)}, "bufs=2", "size=2097152",
		"small=2", "iters=50", "big="+strconv.Itoa(4*mib))
	va := a.waitOversub(t, 10*time.Second)
	if va["total"] != 8*mib || va["big"] != 2 || !strings.Contains(a.stderr.String(), "more than this process's budget") {
		t.Errorf("per-process budget: total %d, growth result %d; want 8 MiB and 2 with a reason:\n%s", va["total"],
			va["big"], a.stderr.String())
	}
}

// Host staging the host cannot give fails the allocation (out of memory, with
// the reason logged), never the process, and hands the reservation back.
func TestOversubAllocationWithoutHostStagingFailsWithOutOfMemory(t *testing.T) {
	if b, err := os.ReadFile("/proc/sys/vm/overcommit_memory"); err != nil || strings.TrimSpace(string(b)) == "1" {
		t.Skip("the kernel overcommits any mapping: a staging reservation cannot fail here")
	}
	const budget = 1 << 50 // a budget the host cannot stage
	e := newMemEnv(t, 50*time.Millisecond, 200*time.Millisecond, budget, ModeAuto)
	held, release := e.gate("release")
	a := e.startOversub(nil, "bufs=1", "size=2097152", "small=2", "iters=20", "big="+strconv.Itoa(1<<48), "hold_until="+held)
	wait.Until(t, 10*time.Second, func() bool { return strings.Contains(a.stdout.String(), "oversub done") }, "the client finished")
	// The shim gives the failed allocation's reservation back in a message of its own, which the scheduler
	// handles after the client printed: wait for the reservation to fall while the client, idle and alive,
	// still holds its connection (a reservation kept would never fall, and the wait fails).
	wait.UntilState(t, 10*time.Second, func() (bool, string) {
		s, ok := e.state(a.pid())
		if !ok {
			return false, "the client is not in the scheduler's snapshot"
		}
		return s.ReservedBytes <= 8*mib, fmt.Sprintf("%d bytes reserved", s.ReservedBytes)
	}, "the failed allocation's reservation is given back")
	release()
	va := a.waitOversub(t, 10*time.Second)
	if va["big"] != 2 || !strings.Contains(a.stderr.String(), "host memory to swap this allocation to") {
		t.Errorf("allocation without host staging: result %d, want 2 and a reason:\n%s", va["big"], a.stderr.String())
	}
}

// Staging that cannot be page-locked still swaps, through pageable memory, with one warning.
func TestOversubSwapsThroughPageableStagingWhenPinningFails(t *testing.T) {
	const budget = 8 * mib
	e := newMemEnv(t, 5*time.Millisecond, 200*time.Millisecond, budget, ModeAuto)
	args := []string{"bufs=3", "size=2097152", "small=0", "iters=300", "sleep_us=50"}
	lim := []string{"GPUSHARE_STUB_HOST_LIMIT=" + strconv.Itoa(2*mib)}
	a, _, va, vb := e.oversubPair(t, 30*time.Second, lim, args...)
	if va["swap_out"]+vb["swap_out"] == 0 {
		t.Error("no swapping happened")
	}
	if n := strings.Count(a.stderr.String(), "cannot page-lock"); n != 1 {
		t.Errorf("%d page-lock warnings, want 1:\n%s", n, a.stderr.String())
	}
}

// Host staging is page-locked in pieces of at most 64 MiB (one cuMemHostRegister of a whole 5.75 GiB
// allocation held the driver, and the application's calls, for seconds on the H100): with the stub
// refusing larger registrations, two processes of 72 MiB allocations swap with every piece pinned and
// every byte right.
func TestOversubPinsStagingInPiecesOfAtMost64MiB(t *testing.T) {
	const budget = 96 * mib
	e := newMemEnv(t, 20*time.Millisecond, 2*time.Second, budget, ModeAuto)
	args := []string{"bufs=1", "size=" + strconv.Itoa(72*mib), "small=0", "iters=2", "sleep_us=200"}
	most := []string{"GPUSHARE_STUB_REGISTER_MAX=" + strconv.Itoa(64*mib)}
	a, b, va, vb := e.oversubPair(t, 90*time.Second, most, args...)
	if va["swap_out"]+vb["swap_out"] == 0 {
		t.Error("no swapping happened")
	}
	for _, p := range []*proc{a, b} {
		if strings.Contains(p.stderr.String(), "cannot page-lock") {
			t.Errorf("client %d could not page-lock its staging:\n%s", p.pid(), p.stderr.String())
		}
	}
}

// PyTorch's other two allocators are swapped too: the stream-ordered one
// (cuMemAllocAsync / cuMemFreeAsync on two streams, freed memory reused in
// stream order) and the application's own VMM handles (expandable segments:
// 2 MiB handles mapped into a reserved range, half of them released while
// mapped, segments unmapped and mapped again). Two such processes at 1.5-1.75x
// the budget keep every byte across hundreds of swaps, physical memory never
// exceeds the budget, and each answers as the driver would.
func TestOversubSwapsPyTorchsOtherAllocatorsToo(t *testing.T) {
	for _, tc := range []struct{ kind, conf, size string }{
		{"async", "backend:cudaMallocAsync", "2097152"}, // 5 x 2 MiB + a 2 MiB slab each: 24 MiB together
		{"vmm", "expandable_segments:True", "4194304"},  // 3 x 2 x 2 MiB handles + a slab each: 28 MiB together
	} {
		t.Run(tc.kind, func(t *testing.T) {
			const budget = 16 * mib
			e := newMemEnv(t, 5*time.Millisecond, 200*time.Millisecond, budget, ModeAuto)
			bufs := "bufs=5"
			if tc.kind == "vmm" {
				bufs = "bufs=3"
			}
			args := []string{"alloc=" + tc.kind, bufs, "size=" + tc.size, "small=8", "iters=1500", "sleep_us=20",
				"verify_every=250"}
			env := []string{"PYTORCH_CUDA_ALLOC_CONF=" + tc.conf}
			a, b, va, vb := e.oversubPair(t, 120*time.Second, env, args...)
			swaps := va["swap_out"] + va["swap_in"] + vb["swap_out"] + vb["swap_in"]
			t.Logf("swaps: a out=%d in=%d, b out=%d in=%d; churned %d and %d; reused %d and %d", va["swap_out"],
				va["swap_in"], vb["swap_out"], vb["swap_in"], va["churned"], vb["churned"], va["swap_async_reused"],
				vb["swap_async_reused"])
			if swaps < 300 {
				t.Errorf("only %d swaps", swaps)
			}
			if p := e.peakPhysical(); p > budget || p == 0 {
				t.Errorf("physical memory of both processes peaked at %d bytes, budget %d", p, budget)
			}
			if g := e.s.GPUs()[0]; g.PeakReservedBytes > budget {
				t.Errorf("scheduler account peaked at %d, budget %d", g.PeakReservedBytes, budget)
			}
			for _, v := range []map[string]int64{va, vb} {
				if v["kind_ok"] != 1 || v["churned"] == 0 || v["total"] != budget {
					t.Errorf("allocator answers: %v (want kind_ok=1, churned>0, total=budget)", v)
				}
			}
			for _, p := range []*proc{a, b} {
				if strings.Contains(p.stderr.String(), "oversubscription is off") {
					t.Errorf("the process was refused:\n%s", p.stderr.String())
				}
			}
			switch tc.kind {
			case "async":
				if va["pool_reserved_after"] != 0 || vb["pool_reserved_after"] != 0 {
					t.Errorf("cuMemPoolTrimTo(0) left memory in the pool: %v %v", va, vb)
				}
				if va["swap_async_reused"] == 0 || vb["swap_async_reused"] == 0 {
					t.Errorf("freed stream-ordered memory was never reused: %v %v", va, vb)
				}
			case "vmm":
				if va["export"] != 801 || !strings.Contains(a.stderr.String(), "cuMemExportToShareableHandle") {
					t.Errorf("export of a swappable handle: %d, want 801 with a log line:\n%s", va["export"],
						a.stderr.String())
				}
			}
		})
	}
}

// Stream-ordered memory the application freed stays with the process, as in
// a pool that keeps everything, but when the process is evicted it goes first
// and without a copy: an idle process that freed its 10 MiB makes room for a
// 12 MiB newcomer (budget 16) without moving a byte.
func TestOversubKeptStreamOrderedMemoryLeavesWithoutACopy(t *testing.T) {
	const budget = 16 * mib
	e := newMemEnv(t, 50*time.Millisecond, 200*time.Millisecond, budget, ModeAuto)
	a, b, release := e.idleThenNewcomer(t, []string{"alloc=async", "bufs=5", "size=2097152", "small=0", "iters=50"},
		"oversub freed", []string{"bufs=5", "size=2097152", "small=0", "iters=50", "seed=3"})
	sa, _ := e.state(a.pid())
	t.Logf("a: need %d resident %d swapped %d outs %d bytes out %d", sa.NeedBytes, sa.ResidentBytes, sa.SwappedBytes,
		sa.SwapOuts, sa.BytesOut)
	if sa.NeedBytes != 10*mib || sa.SwappedBytes != 6*mib || sa.SwapOuts != 3 {
		t.Errorf("the idle client (need %d) gave up %d bytes in %d swap-outs; want 6 MiB of 10 in 3", sa.NeedBytes,
			sa.SwappedBytes, sa.SwapOuts)
	}
	if sa.BytesOut != 0 {
		t.Errorf("%d bytes of freed memory were copied out", sa.BytesOut)
	}
	release()
	a.waitOversub(t, 10*time.Second)
	b.waitOversub(t, 10*time.Second)
}

// The CUDA runtime calls the stream-ordered allocator from threads that have
// no current driver context (PyTorch's autograd thread, on the H100): those
// frees and allocations are still the shim's, with events, so freed memory is
// reused and nothing is left to the driver.
func TestOversubStreamOrderedCallsFromAThreadWithoutAContext(t *testing.T) {
	e := newMemEnv(t, 50*time.Millisecond, 200*time.Millisecond, 16*mib, ModeAuto)
	a := e.startOversub([]string{"GPUSHARE_STUB_THREAD_CTX=1"}, "alloc=async", "churn_thread=1", "bufs=3",
		"size=2097152", "small=4", "iters=400")
	va := a.waitOversub(t, 20*time.Second)
	t.Logf("churned %d, reused %d, new %d, passed to the driver %d", va["churned"], va["swap_async_reused"],
		va["swap_async_new"], va["swap_async_passed"])
	if va["churned"] == 0 || va["swap_async_passed"] != 0 || va["swap_async_reused"] < va["churned"] {
		t.Errorf("churn on a thread without a context: %v (want every allocation the shim's, each reused)", va)
	}
}

// Stream-ordered allocations the shim cannot stand in for go to the driver,
// with one line that says so: here, from a pool the application made current.
func TestOversubPassesStreamOrderedAllocationsFromOtherPoolsThrough(t *testing.T) {
	e := newMemEnv(t, 50*time.Millisecond, 200*time.Millisecond, 16*mib, ModeAuto)
	a := e.startOversub([]string{"GPUSHARE_STUB_CUSTOM_POOL=1"}, "alloc=async", "bufs=2", "size=2097152",
		"small=0", "iters=50")
	va := a.waitOversub(t, 10*time.Second)
	if n := strings.Count(a.stderr.String(), "stream-ordered allocation passed to the driver: a memory pool the application created"); n != 1 {
		t.Errorf("%d pass-through lines, want 1:\n%s", n, a.stderr.String())
	}
	if va["swap_async_new"] != 0 || va["swap_out"] != 0 {
		t.Errorf("memory from another pool was managed by the shim: %v", va)
	}
}

// Auto lets clients whose working sets fit together run at the same time:
// nobody waits; Always makes them take turns.
func TestOversubAutoRunsFittingClientsTogetherAlwaysDoesNot(t *testing.T) {
	for _, mode := range []Mode{ModeAuto, ModeAlways} {
		t.Run(mode.String(), func(t *testing.T) {
			e := newMemEnv(t, 20*time.Millisecond, 200*time.Millisecond, 64*mib, mode)
			args := []string{"bufs=3", "size=2097152", "iters=400", "sleep_us=500"}
			a := e.startOversub([]string{"GPUSHARE_IDLE_MS=1000"}, append(args, "seed=1")...)
			b := e.startOversub([]string{"GPUSHARE_IDLE_MS=1000"}, append(args, "seed=2")...)
			both := false
			for !a.exited() || !b.exited() {
				if g := e.s.GPUs()[0]; g.Holders == 2 {
					both = true
				}
				time.Sleep(time.Millisecond)
			}
			va := a.waitOversub(t, time.Second)
			vb := b.waitOversub(t, time.Second)
			if mode == ModeAuto && (!both || va["swap_out"]+vb["swap_out"] != 0) {
				t.Errorf("Auto: ran together=%v, swaps %d+%d; want together and no swapping", both, va["swap_out"], vb["swap_out"])
			}
			if mode == ModeAlways && both {
				t.Error("Always: two clients held the GPU at once")
			}
		})
	}
}

// pageableCopies counts the stub's records of asynchronous copies through host memory that was not
// page-locked.
func (e *env) pageableCopies() int {
	e.t.Helper()
	data, err := os.ReadFile(e.memtrace())
	if err != nil {
		e.t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "P ") {
			n++
		}
	}
	return n
}

// A swap never copies through staging that is not page-locked yet: on the H100 such a copy (a job's
// first swap-out, ~2 s after its allocation, before the stager had pinned it) ran at 1-4 GB/s against
// 53 GB/s pinned. The stub holds every registration until the test has seen a swap wait for its
// staging, so the first hand-off always comes before the staging is pinned, however the two clients'
// starts fall on a loaded machine; the swap waits for the stager, which pins the evicted regions
// first, and the stub records no copy through pageable memory.
func TestOversubSwapsWaitForStagingToBePinned(t *testing.T) {
	const budget = 96 * mib
	e := newMemEnv(t, 20*time.Millisecond, 2*time.Second, budget, ModeAuto)
	args := []string{"bufs=2", "size=" + strconv.Itoa(36*mib), "small=0", "iters=2", "sleep_us=200"}
	pinGate, pin := e.gate("pin")
	held := []string{"GPUSHARE_STUB_REGISTER_UNTIL=" + pinGate}
	a := e.startOversub(held, append(args, "seed=1")...)
	b := e.startOversub(held, append(args, "seed=2")...)
	// The shim stops waiting for a stager that makes no progress for 2 s: open the gate as soon as a
	// swap says it waits (polled every 10 ms).
	wait.Until(t, 60*time.Second, func() bool {
		return strings.Contains(a.stderr.String()+b.stderr.String(), "swap waits for host staging to be page-locked")
	}, "a swap waits for its staging to be page-locked")
	pin()
	va, vb := a.waitOversub(t, 90*time.Second), b.waitOversub(t, 90*time.Second)
	if va["swap_out"]+vb["swap_out"] == 0 {
		t.Fatal("no swapping happened")
	}
	if va["swap_pin_waits"]+vb["swap_pin_waits"] == 0 {
		t.Errorf("no swap came before its staging was pinned: the test did not test anything (a %v, b %v)", va, vb)
	}
	if n := e.pageableCopies(); n > 0 {
		t.Errorf("%d copies went through host memory that was not page-locked; stderr:\n%s\n%s", n, a.stderr.String(),
			b.stderr.String())
	}
	// The swap's own log line says it waited (the benchmark tells those swaps apart from the copy rate).
	waited := regexp.MustCompile(`swap (out|in): .*; waited [0-9.]+ ms for staging to be page-locked[;)]`)
	if !waited.MatchString(a.stderr.String() + b.stderr.String()) {
		t.Errorf("no swap line says it waited for its staging; stderr:\n%s\n%s", a.stderr.String(), b.stderr.String())
	}
}

// An eviction releases each allocation's pages as soon as its own copy is done, while the copies of
// the allocations after it still run (one synchronization and then hundreds of releases in a row
// cost the H100 swap-out ~10-15% of its rate with 20 MiB allocations). With the stub's worker 5 ms
// late per item, the first release of the evicted process comes before its fourth copy out is done;
// the stub aborts any release whose copy is not done yet.
func TestOversubEvictionReleasesEachAllocationAfterItsOwnCopy(t *testing.T) {
	const budget = 16 * mib
	e := newMemEnv(t, 50*time.Millisecond, 2*time.Second, budget, ModeAuto)
	slow := []string{"GPUSHARE_STUB_WORKER_DELAY_US=5000"}
	held, release := e.gate("release")
	a := e.startOversub(slow, "bufs=6", "size=2097152", "small=0", "iters=20", "hold_until="+held)
	wait.Until(t, 10*time.Second, func() bool {
		return strings.Contains(a.stdout.String(), "oversub done")
	}, "the first client finished its work")
	// b's one 12 MiB allocation takes six of a's allocations in one eviction
	b := e.startOversub(slow, "bufs=1", "size="+strconv.Itoa(12*mib), "small=0", "iters=20", "seed=3")
	b.waitOversub(t, 30*time.Second)
	release()
	a.waitOversub(t, 30*time.Second)
	type rec struct {
		kind string
		ns   int64
	}
	var recs []rec
	data, err := os.ReadFile(e.memtrace())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) != 4 || f[1] != strconv.Itoa(a.pid()) {
			continue
		}
		ns, _ := strconv.ParseInt(f[2], 10, 64)
		if f[0] == "D" || (f[0] == "M" && strings.HasPrefix(f[3], "-")) {
			recs = append(recs, rec{f[0], ns})
		}
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].ns < recs[j].ns })
	seq := ""
	for _, r := range recs {
		seq += r.kind
	}
	// The first eviction takes five allocations (the sixth goes for b's slab): "DDDDDMMMMM..." when
	// every release waits for every copy; the first release must come before the fourth copy is done.
	t.Logf("a's copies out (D) and releases (M), in time order: %s", seq)
	fourth := -1
	for i, n := 0, 0; i < len(seq) && fourth < 0; i++ {
		if seq[i] == 'D' {
			if n++; n == 4 {
				fourth = i
			}
		}
	}
	if fourth < 0 || strings.IndexByte(seq, 'M') > fourth {
		t.Errorf("a's eviction released no pages before its fourth copy out was done: %s", seq)
	}
}

// A swap that waits for the stager lets go of the memory manager's lock meanwhile, and calls that do
// not wait for the GPU can free memory then (cuMemPoolTrimTo frees the stream-ordered memory a
// process kept, which an eviction takes first). Such a free waits until the swap is done: with the
// stub taking 300 ms per registration, an idle process with two kept and two live 2 MiB allocations
// is evicted for an 8 MiB-short newcomer and trims its pool as soon as the scheduler has asked for the
// eviction, inside the eviction's wait for the stager.
// It keeps its data, and its account ends at zero (freeing a region the swap still used left the
// account off and released pages twice).
func TestOversubFreeDuringASwapWaitsForIt(t *testing.T) {
	const budget = 16 * mib
	e := newMemEnv(t, 50*time.Millisecond, 2*time.Second, budget, ModeAuto)
	slow := []string{"GPUSHARE_STUB_REGISTER_US=300000", "PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync"}
	trim := filepath.Join(e.dir, "trim")
	held, release := e.gate("release")
	a := e.startOversub(slow, "alloc=async", "bufs=4", "size=2097152", "small=0", "iters=20", "keep_freed=2",
		"trim_file="+trim, "hold_until="+held, "recheck=1")
	wait.Until(t, 10*time.Second, func() bool {
		return strings.Contains(a.stdout.String(), "oversub done")
	}, "the first client finished its work")
	b := e.startOversub(nil, "bufs=1", "size="+strconv.Itoa(12*mib), "small=0", "iters=20", "seed=3")
	wait.Until(t, 10*time.Second, func() bool {
		s, ok := e.state(a.pid())
		return ok && s.Evictions > 0
	}, "the scheduler asked a to evict")
	if err := os.WriteFile(trim, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	b.waitOversub(t, 30*time.Second)
	release()
	va := a.waitOversub(t, 30*time.Second)
	t.Logf("a: %v", va)
	if va["trimmed_during_hold"] != 1 || !strings.Contains(a.stdout.String(), "oversub rechecked") {
		t.Errorf("a did not trim its pool or check its memory after the hold:\n%s", a.stdout.String())
	}
	if va["swap_out"] == 0 || va["swap_pin_waits"] == 0 {
		t.Errorf("a's eviction did not wait for the stager (swap-outs %d, waits %d): the test tested nothing",
			va["swap_out"], va["swap_pin_waits"])
	}
	if va["swap_resident"] != 0 || va["swap_swapped"] != 0 {
		t.Errorf("a's account at exit, all memory freed: resident %d, swapped %d; want 0 and 0", va["swap_resident"],
			va["swap_swapped"])
	}
}

// The two directions of a hand-off overlap (protocol 3): the process coming back maps and copies in
// while the one it takes the memory from still copies out. a works, then idles holding its memory;
// b takes 8 MiB of it (growth), works and idles; a comes back for a last check of every byte, and
// b's eviction (4 allocations of 2 MiB, each copy 5 ms late on the stub's worker) reports each
// release: a's pages are created between b's releases ("b- a+ b-" in the stub's trace). In series
// every release of b comes before a's first creation. Every byte right in both.
func TestOversubHandOffCopiesInWhileThePreviousHolderCopiesOut(t *testing.T) {
	const budget = 16 * mib
	e := newMemEnv(t, 50*time.Millisecond, 2*time.Second, budget, ModeAuto)
	slow := []string{"GPUSHARE_STUB_WORKER_DELAY_US=5000"}
	heldA, releaseA := e.gate("release-a")
	heldB, releaseB := e.gate("release-b")
	a := e.startOversub(slow, "bufs=6", "size=2097152", "small=0", "iters=20", "hold_until="+heldA, "recheck=1")
	wait.Until(t, 10*time.Second, func() bool {
		return strings.Contains(a.stdout.String(), "oversub done")
	}, "the first client finished its work")
	b := e.startOversub(slow, "bufs=6", "size=2097152", "small=0", "iters=20", "hold_until="+heldB, "seed=3")
	// a comes back once b has worked and idles; b leaves once a is done.
	wait.Until(t, 30*time.Second, func() bool {
		return strings.Contains(b.stdout.String(), "oversub done")
	}, "the second client finished its work")
	releaseA()
	a.waitOversub(t, 30*time.Second)
	releaseB()
	b.waitOversub(t, 30*time.Second)
	type ev struct {
		pid    string
		create bool
		ns     int64
	}
	var evs []ev
	data, err := os.ReadFile(e.memtrace())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) != 4 || f[0] != "M" {
			continue
		}
		ns, _ := strconv.ParseInt(f[2], 10, 64)
		evs = append(evs, ev{f[1], !strings.HasPrefix(f[3], "-"), ns})
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].ns < evs[j].ns })
	ap, bp := strconv.Itoa(a.pid()), strconv.Itoa(b.pid())
	// a creation of a between two releases of b, with no creation of b in between
	overlapped, bReleased, aCreated := false, false, false
	for _, x := range evs {
		switch {
		case x.pid == bp && x.create:
			bReleased, aCreated = false, false
		case x.pid == bp && !x.create:
			if bReleased && aCreated {
				overlapped = true
			}
			bReleased, aCreated = true, false
		case x.pid == ap && x.create && bReleased:
			aCreated = true
		}
	}
	if !overlapped {
		seq := ""
		for _, x := range evs {
			who := map[bool]string{true: "a", false: "b"}[x.pid == ap]
			seq += who + map[bool]string{true: "+", false: "-"}[x.create] + " "
		}
		t.Fatalf("a's swap-in never created pages while b's eviction was still releasing (in series); trace: %s", seq)
	}
}
