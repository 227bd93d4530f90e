package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/scheduler"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/gpu/smi"
)

// The acceptance for a pod of several processes: a two-process pod with one claim holds at most
// the claim in total. On a shim GPU the scheduler keeps one ledger per claim across its processes
// (docs/shim.md, "Claim ledger (protocol 6)"): their allocations together reach at most the claim less a
// context reserve per process, and a process the ledger has no room for is refused its CUDA context. On
// an MPS GPU each process's pinned limit is the claim less one reserve, so two processes can hold more
// than the claim together, and only the claim guard holds the pod to it: it reports the pod
// (docs/dra.md, "What a claim guarantees").
const (
	// twoProcessMemory is the claim: room for two context reserves and allocations besides.
	twoProcessMemory = 4 << 30
	// twoProcessCompute is the claim's compute (an MPS client's thread percentage).
	twoProcessCompute = 20
)

// twoProcessPod runs the case's pod of one claim and two processes, each started with the claim's CDI
// edits in the pod's one container. The shim case fills the claim from both processes and starts a third
// into it; the MPS case fills each process's limit and has the guard report the pod.
func (s *stack) twoProcessPod(ctx context.Context, sc sizedCase, dev sizedDevice, kubelet *draKubelet) {
	s.r.begin("one claim, two processes of one pod, under " + sc.title)
	p := &sizedPod{role: "two", memory: *resource.NewQuantity(twoProcessMemory, resource.BinarySI),
		compute: *resource.NewQuantity(twoProcessCompute, resource.DecimalSI), pod: &corev1.Pod{}}
	p.pod.Name = sc.prefix + "-two"
	var procs []*container
	// Processes, the claim and the pod must not outlive the case, whatever failed.
	defer func() {
		for i, c := range procs {
			s.killWorkload(processName(p, i), c)
		}
		s.sizedCleanup(ctx, kubelet, []*sizedPod{p})
	}()
	// MPS lets each process hold up to the claim; 2 GiB for the third's start and the margin.
	need := 2*twoProcessMemory>>20 + 2<<10
	free := gpuFreeMiB(ctx, s.o.gpuIndex)
	if !s.r.check("GPU: room for the pod's processes", free >= need, "%d MiB free, need %d", free, need) {
		return
	}
	if !s.prepareSizedPod(ctx, sc, dev, kubelet, p) {
		return
	}
	for i := range 2 {
		c, err := s.startInPod(p, processName(p, i))
		if c != nil {
			procs = append(procs, c)
		}
		if !s.r.must("start "+processName(p, i)+" in pod "+p.name()+" with its claim's CDI edits", err) {
			return
		}
	}
	for i, c := range procs {
		ready, err := c.waitEvent(ctx, readyTimeout, "ready", func(e workloadEvent) bool { return e.Event == "ready" })
		if !s.r.must(processName(p, i)+" ready", err) {
			return
		}
		if !s.r.check(processName(p, i)+": the workload is the process placed in the pod", ready.PID == c.pid(), "workload pid %d, placed %d", ready.PID, c.pid()) {
			return
		}
		fmt.Printf("sized %s: claim %s -> mem_get_info total %.2f GiB, free %.2f GiB at its start\n", processName(p, i), gib(p.claimBytes()),
			float64(ready.Total)/(1<<30), float64(ready.Free)/(1<<30))
	}
	if !s.podProcessesKnown(ctx, p, len(procs)) {
		return
	}
	if sc.enforcement == dra.EnforcementMPS {
		s.twoProcessesPastClaim(ctx, sc, p, procs)
	} else {
		s.twoProcessesInOneLedger(ctx, sc, p, procs)
	}
	for i, c := range procs {
		s.exitWorkload(ctx, processName(p, i), c)
	}
}

func processName(p *sizedPod, i int) string { return fmt.Sprintf("%s-%d", p.name(), i+1) }

// startInPod starts one more process of p's container with its claim's CDI edits. The workload waits for
// a line before its first CUDA call, which it gets once the agent can name its pod (inPod): as a
// kubelet's container is in its pod's cgroup before its process runs, the scheduler finds the claim's
// ledger when the process connects, before its context exists. c is returned even with an error, to be
// ended.
func (s *stack) startInPod(p *sizedPod, name string) (*container, error) {
	c, err := s.startWith(name, p.cdi.edits, []string{s.o.python, filepath.Join(s.o.repo, "test/gpu/stack/sized_workload.py"), "gated"})
	if err != nil {
		return nil, err
	}
	if err := s.inPod(p.pod, c.pid()); err != nil {
		return c, err
	}
	return c, c.command("start")
}

// podProcessesKnown waits until the agent names n processes in p's container, lists the claim with the
// memory they use, and judges the pod: WithinClaims True in the same status (a pod is judged once the
// claims it uses are read after it was first seen; until then the condition is Unknown).
func (s *stack) podProcessesKnown(ctx context.Context, p *sizedPod, n int) bool {
	_, err := s.waitGPU(ctx, 30*time.Second, func(_ *v1alpha1.GPUNode, g *v1alpha1.GPUStatus) bool {
		return g.Usage != nil && slices.ContainsFunc(g.Usage.Consumers, func(c v1alpha1.GPUConsumer) bool {
			return c.Namespace == podNamespace && c.Pod == p.name() && c.Container == "main" && int(c.Processes) == n
		}) && claimUsed(g, p) > 0 && withinClaims(g, true, "")
	})
	_, g := s.gpuNode(ctx)
	var usage any
	if g != nil {
		usage = g.Usage
	}
	return s.r.check(fmt.Sprintf("status: the pod's container with its %d processes, its claim's use, WithinClaims True", n), err == nil,
		"usage %s; claims %s; %s", jsonOf(usage), jsonOf(sizedOf(g)), conditionText(g, v1alpha1.ConditionWithinClaims))
}

// claimUsed is the memory the status says p's claim uses (-1 where it lists none).
func claimUsed(g *v1alpha1.GPUStatus, p *sizedPod) int64 {
	if sized := sizedOf(g); sized != nil {
		for _, c := range sized.Claims {
			if c.Namespace == podNamespace && c.Name == p.claim.Name && c.MemoryUsed != nil {
				return c.MemoryUsed.Value()
			}
		}
	}
	return -1
}

// twoProcessesInOneLedger: on a shim GPU both processes are the claim's one ledger; each fills what
// mem_get_info offers, and NVML's sum for them stays within the claim, which the agent reads and does not
// report (nor evict, under Evict). A third process of the pod, started into the full claim, is refused
// its CUDA context with out of memory and lives on, while the two keep what they hold.
func (s *stack) twoProcessesInOneLedger(ctx context.Context, sc sizedCase, p *sizedPod, procs []*container) {
	key := podNamespace + "/" + p.claim.Name
	reserve := int64(dra.DefaultContextReserve)
	var led ledgerFigures
	// A process whose pod the scheduler could not name at its connection joins the ledger when it is found.
	_, err := waitFor(ctx, 30*time.Second, 100*time.Millisecond, func() bool {
		led = s.ledger(ctx, key)
		return led.processes == 2
	}, time.Now())
	// Each process is charged R until NVML has a figure for it, then its context as NVML counts it (never
	// below the floor): the limit is the claim less two such charges.
	floor := int64(scheduler.DefaultContextFloor)
	if !s.r.check("scheduler: both processes in the claim's one ledger, limit the claim less two context charges",
		err == nil && led.limit > 0 && led.limit <= p.claimBytes()-2*floor, "%+v (claim %d, reserve %d, floor %d)", led,
		p.claimBytes(), reserve, floor) {
		return
	}
	var allocated int64
	for i, c := range procs {
		full, ok := s.fillAll(ctx, processName(p, i), c)
		if !ok {
			return
		}
		allocated += full.Bytes
	}
	held, err := smi.Memory()
	pid1, pid2 := int32(procs[0].pid()), int32(procs[1].pid())
	sum := int64(held[pid1] + held[pid2])
	s.r.check("NVML: the pod's two processes, both full, hold at most the claim together", err == nil && held[pid1] > 0 && held[pid2] > 0 && sum <= p.claimBytes(),
		"%d + %d = %d MiB of the %d MiB claim (allocated %d MiB; %v)", held[pid1]>>20, held[pid2]>>20, sum>>20, p.claimBytes()>>20, allocated>>20, err)
	_, err = s.waitGPU(ctx, 30*time.Second, func(_ *v1alpha1.GPUNode, g *v1alpha1.GPUStatus) bool { return claimUsed(g, p) >= allocated })
	_, g := s.gpuNode(ctx)
	events, deleting := s.claimExceededEvents(ctx, p.name()), s.podDeleting(ctx, p.name())
	s.r.check(fmt.Sprintf("status: the claim's use within the claim, WithinClaims True, the pod not reported and not evicted (onExceed Evict: %v)", sc.evicts),
		err == nil && claimUsed(g, p) <= p.claimBytes() && withinClaims(g, true, "") && len(events) == 0 && !deleting,
		"used %d MiB of %d MiB (%v); %s; events %q; deleting %v", claimUsed(g, p)>>20, p.claimBytes()>>20, err,
		conditionText(g, v1alpha1.ConditionWithinClaims), events, deleting)

	third := processName(p, 2)
	ledFull := s.ledger(ctx, key)
	c, err := s.startInPod(p, third)
	if c != nil {
		defer s.killWorkload(third, c)
	}
	if !s.r.must("start "+third+" in pod "+p.name()+" into the full claim", err) {
		return
	}
	answer, err := c.waitEvent(ctx, readyTimeout, "its CUDA context or its refusal", func(e workloadEvent) bool { return e.Event == "refused" || e.Event == "ready" })
	after, smiErr := smi.Memory()
	_, onGPU := after[int32(c.pid())]
	s.r.check(third+": its CUDA context refused with out of memory; it lives on and holds nothing",
		err == nil && answer.Event == "refused" && strings.Contains(answer.Error, "out of memory") && c.running() && !onGPU && smiErr == nil,
		"%s %q (%v); running %v; on the GPU %v", answer.Event, answer.Error, err, c.running(), onGPU)
	ledAfter := s.ledger(ctx, key)
	s.r.check("scheduler: the ledger refused the third process and counts two", ledAfter.processes == 2 && ledAfter.refusals > ledFull.refusals,
		"before %+v, after %+v", ledFull, ledAfter)
	s.r.check("NVML: the two processes keep what they hold", after[pid1] >= held[pid1] && after[pid2] >= held[pid2] && procs[0].running() && procs[1].running(),
		"%d and %d MiB, %d and %d MiB before", after[pid1]>>20, after[pid2]>>20, held[pid1]>>20, held[pid2]>>20)
	s.exitWorkload(ctx, third, c)
	events, deleting = s.claimExceededEvents(ctx, p.name()), s.podDeleting(ctx, p.name())
	s.r.check("API: the pod, its claim full, never reported and not evicted", len(events) == 0 && !deleting, "events %q; deleting %v", events, deleting)
}

// twoProcessesPastClaim: on an MPS GPU each process's pinned limit is the claim less one context reserve,
// so two processes that fill their limits hold more than the claim together; the guard reports the pod
// (WithinClaims False naming it, a ClaimExceeded event) within exceedTarget of the second fill's start,
// and, under Report, does not evict it. Released, the pod is within its claim again.
func (s *stack) twoProcessesPastClaim(ctx context.Context, sc sizedCase, p *sizedPod, procs []*container) {
	limit := p.claimBytes() - int64(dra.DefaultContextReserve)
	first, ok := s.fillAll(ctx, processName(p, 0), procs[0])
	if !ok {
		return
	}
	// The pod passes its claim during the second fill: timed from its command, an upper bound.
	sent := time.Now()
	second, ok := s.fillAll(ctx, processName(p, 1), procs[1])
	if !ok {
		return
	}
	held, err := smi.Memory()
	pid1, pid2 := int32(procs[0].pid()), int32(procs[1].pid())
	sum := int64(held[pid1] + held[pid2])
	s.r.check("NVML: each process within the claim (its limit, the claim less the context reserve), the two together past it",
		err == nil && first.Bytes <= limit && second.Bytes <= limit && int64(held[pid1]) <= p.claimBytes() && int64(held[pid2]) <= p.claimBytes() && sum > p.claimBytes(),
		"allocated %d and %d MiB of %d MiB limits (the second fill in %.2fs); NVML %d + %d = %d MiB, claim %d MiB (%v)", first.Bytes>>20, second.Bytes>>20,
		limit>>20, second.at().Sub(sent).Seconds(), held[pid1]>>20, held[pid2]>>20, sum>>20, p.claimBytes()>>20, err)
	d, events, err := s.waitReported(ctx, p.name(), sent)
	_, g := s.gpuNode(ctx)
	if s.r.check("status: WithinClaims False naming the pod of two processes, and a warning event on it", err == nil, "%s; events %q (%v)",
		conditionText(g, v1alpha1.ConditionWithinClaims), events, err) {
		s.r.timed(sc.prefix+": a pod of two processes past its claim reported after the second's fill began", d, exceedTarget)
	}
	for i, c := range procs {
		if !s.r.must(processName(p, i)+" told to release", c.command("release")) {
			return
		}
		if _, err := c.waitEvent(ctx, 30*time.Second, "its release", func(e workloadEvent) bool { return e.Event == "released" }); !s.r.must(processName(p, i)+" released", err) {
			return
		}
	}
	_, err = s.waitGPU(ctx, 30*time.Second, func(_ *v1alpha1.GPUNode, g *v1alpha1.GPUStatus) bool { return withinClaims(g, true, "") })
	_, g = s.gpuNode(ctx)
	s.r.check("status: WithinClaims True again once the processes released their memory", err == nil, "%s", conditionText(g, v1alpha1.ConditionWithinClaims))
	// Checked after the passes that saw the pod over its claim and then within: any eviction is done.
	deleting := s.podDeleting(ctx, p.name())
	s.r.check("API: the pod of two processes not evicted (onExceed Report), both running", !deleting && procs[0].running() && procs[1].running(),
		"deleting %v, running %v and %v", deleting, procs[0].running(), procs[1].running())
}

// fillAll has c allocate all mem_get_info offers it and keep it; false where it did not end its fill.
func (s *stack) fillAll(ctx context.Context, name string, c *container) (workloadEvent, bool) {
	if !s.r.must(name+" told to fill what mem_get_info offers", c.command("fillall")) {
		return workloadEvent{}, false
	}
	full, err := c.waitEvent(ctx, 60*time.Second, "the end of its fill", func(e workloadEvent) bool { return e.Event == "full" })
	if !s.r.must(name+" filled", err) {
		return full, false
	}
	s.r.check(name+": allocated all mem_get_info offered", full.Free < 4<<20,
		"allocated %d MiB, %d MiB offered still, total %d MiB (%q)", full.Bytes>>20, full.Free>>20, full.Total>>20, full.Error)
	return full, true
}

// exitWorkload tells c to exit and waits for its last report and its end, with status 0.
func (s *stack) exitWorkload(ctx context.Context, name string, c *container) {
	if !s.r.must(name+" told to exit", c.command("exit")) {
		return
	}
	_, err := c.waitEvent(ctx, 30*time.Second, "its last report", func(e workloadEvent) bool { return e.Event == "done" })
	if err == nil {
		select {
		case <-c.done:
			err = c.err
		case <-time.After(30 * time.Second):
			err = fmt.Errorf("still running 30s after its last report")
		}
	}
	s.r.must(name+" exits cleanly", err)
}
