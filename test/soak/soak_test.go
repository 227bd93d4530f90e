// Package soak runs the node's deciding parts (the shim over the stub driver, the GPU scheduler with the
// agent's claim ledgers, the claim guard's judgement) under a seeded random mix of clients and faults, and
// checks invariants rather than stories (docs/reliability.md, "Soak"). It runs only when SOAK_DURATION is
// set: `make soak`.
package soak

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// stepsPerSeed is one episode's length: the seed draws a node, its pods and claims, and this many steps.
const stepsPerSeed = 200

// TestSoak runs seeds SOAK_SEED, SOAK_SEED+1, ... until SOAK_DURATION has passed (SOAK_SEEDS=n: exactly
// n seeds instead). SOAK_SHIM_BUILD is shim/build with the library, the stub driver and soak_client.
// SOAK_WITHOUT=kill,restart,... leaves those faults out; SOAK_TRACE=1 prints every step and the
// scheduler's log, SOAK_TRACE=steps the steps alone.
func TestSoak(t *testing.T) {
	dur, err := time.ParseDuration(os.Getenv("SOAK_DURATION"))
	if err != nil || dur <= 0 {
		t.Skip("SOAK_DURATION is not set: the soak runs with make soak")
	}
	seed := uint64(time.Now().UnixNano() % 1_000_000)
	if v := os.Getenv("SOAK_SEED"); v != "" {
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("SOAK_SEED %q: %v", v, err)
		}
	}
	seeds := -1
	if v := os.Getenv("SOAK_SEEDS"); v != "" {
		if seeds, err = strconv.Atoi(v); err != nil {
			t.Fatalf("SOAK_SEEDS %q: %v", v, err)
		}
	}
	build, err := filepath.Abs(os.Getenv("SOAK_SHIM_BUILD"))
	if err != nil || os.Getenv("SOAK_SHIM_BUILD") == "" {
		t.Fatal("SOAK_SHIM_BUILD must name shim/build (make soak sets it)")
	}
	if _, err := os.Stat(filepath.Join(build, "tests", "soak_client")); err != nil {
		t.Fatalf("no soak client: %v (make -C shim testbins)", err)
	}
	without := map[string]bool{}
	for _, f := range strings.FieldsFunc(os.Getenv("SOAK_WITHOUT"), func(r rune) bool { return r == ',' || r == ' ' }) {
		if !slices.Contains(faults, f) {
			t.Fatalf("SOAK_WITHOUT: no fault %q (faults: %s)", f, strings.Join(faults, ", "))
		}
		without[f] = true
	}
	if !without["freeze"] && !cgroupsUsable() {
		t.Log("soak: this machine makes no cgroup v2 freezer (root and cgroup v2 are needed): every stall is a SIGSTOP")
	}
	start := time.Now()
	var all []violation
	ran, steps, dropped := 0, 0, 0
	kinds := map[string]int{}
	for s := seed; (seeds < 0 && time.Since(start) < dur) || (seeds >= 0 && ran < seeds); s++ {
		dir, err := os.MkdirTemp("", "soak")
		if err != nil {
			t.Fatal(err)
		}
		e := newEpisode(s, build, dir)
		e.without, e.cgroups = without, !without["freeze"] && cgroupsUsable()
		e.run(stepsPerSeed)
		ran++
		steps += e.step
		dropped += e.counts["drop"]
		for k, n := range e.counts {
			kinds[k] += n
		}
		all = append(all, e.chk.violations...)
		_ = os.RemoveAll(dir)
		t.Logf("seed %d: %d GPUs, %d pods, %d claims, %d steps, %d violations", s, len(e.uuids), len(e.pods), len(e.claims),
			e.step, len(e.chk.violations))
	}
	t.Logf("soak: %d seeds from %d, %d steps in %s, %d violations, %d processes that dropped the shim checked for naming",
		ran, seed, steps, time.Since(start).Round(time.Second), len(all), dropped)
	byInv := map[int]int{}
	for _, v := range all {
		byInv[v.inv]++
	}
	t.Logf("soak: violations by invariant %v; steps by kind %v", byInv, kinds)
	for _, v := range all {
		t.Errorf("%s (reproduce: make soak SOAK_SEED=%d SOAK_SEEDS=1)", v, v.seed)
	}
}
