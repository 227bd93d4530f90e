package main

import (
	"context"
	"fmt"
	"time"

	v1alpha1 "github.com/gpusharing/gpusharing/api/v1alpha1"
)

// fillRuns is how many times a pod fills its claim to the last byte: every run must stay unreported.
const fillRuns = 3

// fillToTheLastByte has p, with its claim's limits, allocate everything mem_get_info offers it, to the
// last 2 MiB, and keep it, fillRuns times. A claim bounds what its pods hold as NVML counts it, the CUDA
// context included, and the limits leave the context reserve for that: once the accounting has read the
// filled process (the status lists the claim's use at least what it allocated), the GPU must be
// WithinClaims True, no ClaimExceeded event may name the pod, and it must not be evicted, also where the
// policy says Evict.
func (s *stack) fillToTheLastByte(ctx context.Context, sc sizedCase, p, other *sizedPod) {
	for run := 1; run <= fillRuns; run++ {
		what := fmt.Sprintf("%s fills its %s claim to the last byte mem_get_info offers (run %d of %d)", p.name(), gib(p.claimBytes()), run, fillRuns)
		if !s.r.must(what, p.c.command("fillall")) {
			return
		}
		full, err := p.c.waitEvent(ctx, 60*time.Second, "the end of its fill", func(e workloadEvent) bool { return e.Event == "full" })
		if !s.r.must(what, err) {
			return
		}
		s.r.check(fmt.Sprintf("%s: run %d allocated all mem_get_info offered", p.name(), run), full.Free < 4<<20 && full.Bytes > 0,
			"allocated %d MiB, %d MiB offered still, total %d MiB (%q)", full.Bytes>>20, full.Free>>20, full.Total>>20, full.Error)
		// The agent's read after the fill: the claim's use in status at least what was allocated.
		var used int64
		_, err = s.waitGPU(ctx, 30*time.Second, func(_ *v1alpha1.GPUNode, g *v1alpha1.GPUStatus) bool {
			sized := sizedOf(g)
			if sized == nil {
				return false
			}
			for _, c := range sized.Claims {
				if c.Name == p.claim.Name && c.MemoryUsed != nil && c.MemoryUsed.Value() >= full.Bytes {
					used = c.MemoryUsed.Value()
					return true
				}
			}
			return false
		})
		_, g := s.gpuNode(ctx)
		if !s.r.check(fmt.Sprintf("status: run %d read by the agent", run), err == nil, "%s", jsonOf(sizedOf(g))) {
			return
		}
		events := s.claimExceededEvents(ctx, p.name())
		deleting := s.podDeleting(ctx, p.name())
		s.r.check(fmt.Sprintf("%s: run %d, its claim full, not reported and not evicted (onExceed Evict: %v)", p.name(), run, sc.evicts),
			withinClaims(g, true, "") && len(events) == 0 && !deleting && p.c.running(),
			"NVML %d MiB of its %d MiB claim; %s; events %q; deleting %v", used>>20, p.claimBytes()>>20,
			conditionText(g, v1alpha1.ConditionWithinClaims), events, deleting)
		if !s.r.must(p.name()+" told to release", p.c.command("release")) {
			return
		}
		if _, err := p.c.waitEvent(ctx, 30*time.Second, "its release", func(e workloadEvent) bool { return e.Event == "released" }); !s.r.must(p.name()+" released", err) {
			return
		}
	}
	s.r.check(other.name()+" still running through the fills", other.c.running(), "")
}
