package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/testenv"
)

// smsPerTPC: MPS hands out SMs in whole TPCs (two SMs each on Hopper and Ampere), so a client's SM count
// is its percentage of the GPU's rounded to a TPC.
const smsPerTPC = 2

// checkSizedViews checks what each process sees of the GPU: A and B their claims as the GPU's memory
// (within one memory step), and under MPS their claims' thread percentages as their SM counts; the pod
// without its limits sees the whole GPU, and under MPS is no client of the daemon.
func (s *stack) checkSizedViews(ctx context.Context, sc sizedCase, dev sizedDevice, a, b, over *sizedPod) {
	step := int64(1 << 30)
	if p := dev.dev.Capacity[dra.CapacityMemory].RequestPolicy; p != nil && p.ValidRange != nil && p.ValidRange.Step != nil {
		step = p.ValidRange.Step.Value()
	}
	full := over.ready.SMs
	for _, p := range []*sizedPod{a, b, over} {
		fmt.Printf("sized %s: claim %s, %d%% -> mem_get_info total %.2f GiB, free %.2f GiB; %d SMs (%d without limits)\n",
			p.name(), gib(p.claimBytes()), p.computePercent(), float64(p.ready.Total)/(1<<30), float64(p.ready.Free)/(1<<30), p.ready.SMs, full)
	}
	for _, p := range []*sizedPod{a, b} {
		s.r.check(p.name()+": mem_get_info's total is its claim", p.ready.Total <= p.claimBytes() && p.ready.Total > p.claimBytes()-step,
			"total %d bytes, claim %d (step %d)", p.ready.Total, p.claimBytes(), step)
	}
	s.r.check(over.name()+": without its limits it sees the whole GPU", over.ready.Total > 2*over.claimBytes(), "total %d bytes, claim %d", over.ready.Total, over.claimBytes())
	if sc.enforcement != dra.EnforcementMPS {
		// Compute is not capped on shim GPUs (docs/shim.md): the figures above show it.
		return
	}
	for _, p := range []*sizedPod{a, b} {
		want := float64(p.computePercent()) * float64(full) / 100
		s.r.check(p.name()+": its SM count is its claim's compute", full > 0 && p.ready.SMs < full && math.Abs(float64(p.ready.SMs)-want) <= smsPerTPC,
			"%d SMs of %d, %d%% is %.1f", p.ready.SMs, full, p.computePercent(), want)
	}
	clients := mpsClients(ctx, s.mpsRoot, s.gpuUUID)
	s.r.check("GPU: A and B are clients of the GPU's MPS daemon, the pod without its limits is not",
		slices.Contains(clients, a.ready.PID) && slices.Contains(clients, b.ready.PID) && !slices.Contains(clients, over.ready.PID),
		"daemon's clients %v; pids %d, %d, %d", clients, a.ready.PID, b.ready.PID, over.ready.PID)
}

// checkClaimsListed waits until the GPU's status lists every claim with its pod, size and the memory
// its pod's processes use: the agent named each process's pod.
func (s *stack) checkClaimsListed(ctx context.Context, pods []*sizedPod) bool {
	_, err := s.waitGPU(ctx, 30*time.Second, func(_ *v1alpha1.GPUNode, g *v1alpha1.GPUStatus) bool {
		if g.Sized == nil {
			return false
		}
		for _, p := range pods {
			i := slices.IndexFunc(g.Sized.Claims, func(c v1alpha1.SizedClaimStatus) bool { return c.Namespace == podNamespace && c.Name == p.name() })
			if i < 0 {
				return false
			}
			c := g.Sized.Claims[i]
			if !slices.Equal(c.Pods, []string{p.name()}) || c.Memory == nil || c.Memory.Value() != p.claimBytes() || int64(c.Compute) != p.computePercent() ||
				c.MemoryUsed == nil || c.MemoryUsed.Sign() <= 0 {
				return false
			}
		}
		return true
	})
	_, g := s.gpuNode(ctx)
	return s.r.check("status: the GPU lists the claims with their pods and what each pod uses", err == nil, "%s", jsonOf(sizedOf(g)))
}

// fillPastClaim has p allocate 1 GiB at a time past its claim: it must get a clean out-of-memory at its
// claim and compute on, while other keeps computing, correctly.
func (s *stack) fillPastClaim(ctx context.Context, p, other *sizedPod) {
	sent := time.Now()
	before, _ := other.c.lastEvent("progress", sent)
	if !s.r.must(p.name()+" told to fill memory", p.c.command(fmt.Sprintf("fill %d", p.claimGiB()+2))) {
		return
	}
	f, err := p.c.waitEvent(ctx, 60*time.Second, "the end of its fill", func(e workloadEvent) bool { return e.Event == "filled" })
	if !s.r.must(p.name()+" fills memory", err) {
		return
	}
	got := int64(f.GiB)
	// Its limit is the claim less the context reserve, and its own context takes more of that on MPS: the
	// last two of the claim's GiB can be out of reach of 1 GiB pieces.
	s.r.check(p.name()+": a clean out-of-memory at its claim, and it computes on", f.OOM && got <= p.claimGiB() && got >= p.claimGiB()-2 && f.AfterOK,
		"claim %d GiB: %d GiB allocated in %.2fs before %q; correct after: %v", p.claimGiB(), got, f.at().Sub(sent).Seconds(), f.Error, f.AfterOK)
	after, err := other.c.waitEvent(ctx, 15*time.Second, "a report after the other's out-of-memory", func(e workloadEvent) bool {
		return e.Event == "progress" && e.at().After(f.at().Add(time.Second))
	})
	s.r.check(other.name()+" keeps computing, correctly, through "+p.name()+"'s out-of-memory", err == nil && after.Steps > before.Steps && after.Bad == 0 && other.c.running(),
		"%d matmuls before the fill, %d a second after its end, %d wrong (%v)", before.Steps, after.Steps, after.Bad, err)
}

// passClaim has the pod without its limits take overGiB, past its claim, and measures the time from
// its allocation until the agent reports it: the GPU's WithinClaims False (ClaimExceeded) naming the
// pod, and a warning event on the pod. A policy with onExceed Evict evicts it, Report does not, and
// neither touches the pods within their claims. No kubelet here ends an evicted pod's process, so it is
// killed here; the GPU is then within its claims again.
func (s *stack) passClaim(ctx context.Context, sc sizedCase, over *sizedPod, within []*sizedPod) {
	_, err := s.waitGPU(ctx, 30*time.Second, func(_ *v1alpha1.GPUNode, g *v1alpha1.GPUStatus) bool { return withinClaims(g, true, "") })
	_, g := s.gpuNode(ctx)
	s.r.check("status: WithinClaims True before any pod passes its claim", err == nil, "%s", conditionText(g, v1alpha1.ConditionWithinClaims))
	if !s.r.must(over.name()+" told to take "+fmt.Sprint(overGiB)+" GiB", over.c.command(fmt.Sprintf("hold %d", overGiB))) {
		return
	}
	held, err := over.c.waitEvent(ctx, 30*time.Second, "its allocation", func(e workloadEvent) bool { return e.Event == "held" })
	if !s.r.must(over.name()+" holds "+fmt.Sprint(overGiB)+" GiB, past its "+gib(over.claimBytes())+" claim", err) {
		return
	}
	d, events, err := s.waitReported(ctx, over.name(), held.at())
	_, g = s.gpuNode(ctx)
	if !s.r.check("status: WithinClaims False naming the pod, and a warning event on it", err == nil, "%s; events %q (%v)",
		conditionText(g, v1alpha1.ConditionWithinClaims), events, err) {
		return
	}
	s.r.timed(sc.prefix+": a pod past its claim reported after its allocation", d, exceedTarget)
	if sc.evicts {
		_, err := waitFor(ctx, 15*time.Second, 50*time.Millisecond, func() bool { return s.podDeleting(ctx, over.name()) }, time.Now())
		s.r.check("API: the pod past its claim evicted (onExceed Evict)", err == nil, "%v", err)
	}
	over.c.kill()
	<-over.c.done
	_, err = s.waitGPU(ctx, 30*time.Second, func(_ *v1alpha1.GPUNode, g *v1alpha1.GPUStatus) bool { return withinClaims(g, true, "") })
	_, g = s.gpuNode(ctx)
	s.r.check("status: WithinClaims True again once its process is gone", err == nil, "%s", conditionText(g, v1alpha1.ConditionWithinClaims))
	if !sc.evicts {
		// Checked after the passes that saw the pod over its claim and then within: any eviction is done.
		deleting := s.podDeleting(ctx, over.name())
		s.r.check("API: the pod past its claim not evicted (onExceed Report)", !deleting, "deleting %v", deleting)
	}
	for _, p := range within {
		deleting := s.podDeleting(ctx, p.name())
		s.r.check("API: "+p.name()+", within its claim, not evicted and running", !deleting && p.c.running(), "deleting %v, running %v", deleting, p.c.running())
	}
}

// endSized ends the pods within their claims as a kubelet does: their workloads exit, the pods turn
// Succeeded, and then their claims, and the over pod's, are unprepared (each CDI spec removed, the
// GPU's status listing no claim). Until then, and after, no pod within its claims may have been
// reported over them: no ClaimExceeded event names one.
func (s *stack) endSized(ctx context.Context, kubelet *draKubelet, pods []*sizedPod) {
	var within []string
	for _, p := range pods {
		if p.hostile {
			continue
		}
		within = append(within, p.name())
		if !s.r.must(p.name()+" told to exit", p.c.command("exit")) {
			continue
		}
		done, err := p.c.waitEvent(ctx, 30*time.Second, "its last report", func(e workloadEvent) bool { return e.Event == "done" })
		s.r.check(p.name()+": correct results throughout", err == nil && done.Bad == 0 && done.Steps > 0,
			"%d matmuls, %d wrong (%v)", done.Steps, done.Bad, err)
		select {
		case <-p.c.done:
		case <-time.After(30 * time.Second):
			s.r.check(p.name()+" exits", false, "still running 30s after its last report")
		}
		s.r.must("pod "+p.name()+" Succeeded", testenv.WritePodPhase(ctx, s.c, p.pod, corev1.PodSucceeded))
	}
	for _, p := range pods {
		if !p.prepared {
			continue
		}
		if !s.r.must("NodeUnprepareResources "+p.name(), kubelet.unprepare(ctx, p.claim)) {
			continue
		}
		p.prepared = false
		var left []string
		for _, f := range p.cdi.files {
			if _, err := os.Stat(f); !os.IsNotExist(err) {
				left = append(left, f)
			}
		}
		s.r.check("CDI: "+p.name()+"'s spec removed", len(left) == 0, "left %v", left)
	}
	_, err := s.waitGPU(ctx, 30*time.Second, func(_ *v1alpha1.GPUNode, g *v1alpha1.GPUStatus) bool {
		return (g.Sized == nil || len(g.Sized.Claims) == 0) && withinClaims(g, true, "")
	})
	_, g := s.gpuNode(ctx)
	s.r.check("status: no claim listed once unprepared, WithinClaims True", err == nil, "%s; %s", jsonOf(sizedOf(g)), conditionText(g, v1alpha1.ConditionWithinClaims))
	var wrong []string
	for _, name := range within {
		wrong = append(wrong, s.claimExceededEvents(ctx, name)...)
	}
	s.r.check("API: no pod within its claims was reported over them", len(wrong) == 0, "%q", wrong)
}

// waitReported waits until the agent reports pod over its claims: the GPU's WithinClaims False naming
// it, and a ClaimExceeded event on it. It returns the time since since, and the events.
func (s *stack) waitReported(ctx context.Context, pod string, since time.Time) (time.Duration, []string, error) {
	ref := podNamespace + "/" + pod
	var events []string
	d, err := waitFor(ctx, 30*time.Second, 20*time.Millisecond, func() bool {
		_, g := s.gpuNode(ctx)
		if !withinClaims(g, false, ref+" holds") {
			return false
		}
		events = s.claimExceededEvents(ctx, pod)
		return len(events) > 0
	}, since)
	return d, events, err
}

// withinClaims says whether the GPU's WithinClaims condition has the status, its message containing
// naming (for False); false without a status.
func withinClaims(g *v1alpha1.GPUStatus, ok bool, naming string) bool {
	if g == nil {
		return false
	}
	c := condition(g.Conditions, v1alpha1.ConditionWithinClaims)
	if c == nil {
		return false
	}
	if ok {
		return c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonAsClaimed
	}
	return c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.ReasonClaimExceeded && strings.Contains(c.Message, naming)
}

// claimExceededEvents are the ClaimExceeded events about the pod, "type: note".
func (s *stack) claimExceededEvents(ctx context.Context, pod string) []string {
	var list eventsv1.EventList
	if err := s.c.List(ctx, &list, client.InNamespace(podNamespace)); err != nil {
		return nil
	}
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Kind == "Pod" && e.Regarding.Name == pod && e.Reason == v1alpha1.ReasonClaimExceeded {
			out = append(out, e.Type+": "+e.Note)
		}
	}
	return out
}

// podDeleting says whether the pod is being deleted or gone (an eviction of a pod on a node deletes it
// with its grace period; no kubelet here ends it).
func (s *stack) podDeleting(ctx context.Context, name string) bool {
	var p corev1.Pod
	err := s.c.Get(ctx, client.ObjectKey{Namespace: podNamespace, Name: name}, &p)
	return apierrors.IsNotFound(err) || (err == nil && p.DeletionTimestamp != nil)
}

func gib(b int64) string { return fmt.Sprintf("%gGi", float64(b)/(1<<30)) }
