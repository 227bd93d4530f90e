package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// The acceptance for sized claims: two PyTorch processes with 8 GiB and 16 GiB claims share one
// GPU, once under MPS and once under the shim; mem_get_info reports 8 and 16 GiB; allocating past its
// claim raises a clean out-of-memory in that process only while the other keeps running; a process
// without the limits that exceeds its claim is reported within 5 s (and evicted where the policy says
// so); the MPS claim's thread percentage shows in the SM count.
const (
	// exceedTarget is the bound from a process passing its claim to the GPU's WithinClaims=False.
	exceedTarget = 5 * time.Second
	// overGiB is what the process without the limits allocates: 1 GiB past its 2Gi claim (its CUDA
	// context comes on top in NVML's figure).
	overGiB = 3
	// readyTimeout bounds a workload's start: python, torch, the CUDA context (an MPS server for the first
	// client of the daemon).
	readyTimeout = 120 * time.Second
)

// sizedCase is one GPU sharing that sizes claims: the policy, what publishes and enforces the size, and
// what the agent does about a pod past its claims.
type sizedCase struct {
	title       string
	policy      string
	strategy    v1alpha1.Strategy
	enforcement string // the sized device's sizeEnforcement attribute
	evicts      bool
	prefix      string // of the pods' and claims' names
}

var sizedCases = []sizedCase{
	{title: "MPS, onExceed Report", policy: "sized-mps.yaml", strategy: v1alpha1.StrategyMPS, enforcement: dra.EnforcementMPS, prefix: "sized-mps"},
	{title: "the shim (Exclusive with oversubscription), onExceed Evict", policy: "sized-shim.yaml", strategy: v1alpha1.StrategyExclusive,
		enforcement: dra.EnforcementShimMemory, evicts: true, prefix: "sized-shim"},
}

// sizedPod is one pod of a case: its claim's request, and once started its workload.
type sizedPod struct {
	role            string // a, b, over
	memory, compute resource.Quantity
	// hostile pods drop the limits their claim's CDI edits set (LD_PRELOAD, CUDA_MPS_*, GPUSHARE_*).
	hostile bool

	pod      *corev1.Pod
	claim    *resourcev1.ResourceClaim
	consumed map[resourcev1.QualifiedName]resource.Quantity
	cdi      cdiResolved
	prepared bool
	c        *container
	ready    workloadEvent
}

func (p *sizedPod) name() string { return p.pod.Name }

// claimGiB is the memory the claim was allocated, in GiB.
func (p *sizedPod) claimGiB() int64 {
	m := p.consumed[dra.CapacityMemory]
	return m.Value() >> 30
}

func (p *sizedPod) claimBytes() int64 {
	m := p.consumed[dra.CapacityMemory]
	return m.Value()
}

func (p *sizedPod) computePercent() int64 {
	c := p.consumed[dra.CapacityCompute]
	return c.Value()
}

func newSizedPods() []*sizedPod {
	return []*sizedPod{
		{role: "a", memory: resource.MustParse("8Gi"), compute: resource.MustParse("25")},
		{role: "b", memory: resource.MustParse("16Gi"), compute: resource.MustParse("50")},
		{role: "over", memory: resource.MustParse("2Gi"), compute: resource.MustParse("5"), hostile: true},
	}
}

// sizedClaims runs each sized case, then deletes the policy: the GPU is Exclusive again, with nothing of
// the cases left.
func (s *stack) sizedClaims(ctx context.Context) {
	start := time.Now()
	for _, sc := range sizedCases {
		s.sizedCase(ctx, sc)
	}
	s.sizedPolicyDeleted(ctx)
	fmt.Printf("time sized claims, both cases and the policy's deletion: %.1fs\n", time.Since(start).Seconds())
}

// sizedCase applies the case's policy, prepares three claims through the agent's kubelet plugin and runs
// their workloads: A (8Gi, 25%) and B (16Gi, 50%) with their claims' limits, each filling memory until
// out-of-memory while the other computes, and a third pod (2Gi) without its limits that takes 4 GiB.
// Then a pod of one claim runs two processes (twoProcessPod).
func (s *stack) sizedCase(ctx context.Context, sc sizedCase) {
	s.r.begin("sized claims under " + sc.title + ": 8Gi/25% and 16Gi/50% on one GPU, and a pod past its claim")
	pods := newSizedPods()
	for _, p := range pods {
		p.pod = &corev1.Pod{}
		p.pod.Name = sc.prefix + "-" + p.role
	}
	// Claims, processes and mount points must not outlive the case, whatever failed.
	kubelet, err := dialDRA(s.draDir)
	if !s.r.must("dial the agent's DRA kubelet plugin", err) {
		return
	}
	defer kubelet.close()
	defer s.sizedCleanup(ctx, kubelet, pods)

	// The GPU is shared with other users: the case needs the claims' memory and the over pod's, plus the
	// processes' contexts.
	need := (8 + 16 + overGiB + 4) << 10
	free := gpuFreeMiB(ctx, s.o.gpuIndex)
	if !s.r.check("GPU: room for the claims", free >= need, "%d MiB free, need %d", free, need) {
		return
	}
	dev, ok := s.applySized(ctx, sc)
	if !ok {
		return
	}
	if !s.startSizedPods(ctx, sc, dev, kubelet, pods) {
		return
	}
	a, b, over := pods[0], pods[1], pods[2]
	s.checkSizedViews(ctx, sc, dev, a, b, over)
	s.checkClaimsListed(ctx, pods)
	s.fillToTheLastByte(ctx, sc, a, b)
	s.fillPastClaim(ctx, a, b)
	s.fillPastClaim(ctx, b, a)
	s.passClaim(ctx, sc, over, []*sizedPod{a, b})
	s.endSized(ctx, kubelet, pods)
	s.twoProcessPod(ctx, sc, dev, kubelet)
}

// applySized applies the case's policy and waits until the GPU applies it and the node's slice
// publishes its sized device.
func (s *stack) applySized(ctx context.Context, sc sizedCase) (sizedDevice, bool) {
	applied := time.Now()
	if !s.r.must("kubectl apply "+sc.policy, s.apply(ctx, sc.policy)) {
		return sizedDevice{}, false
	}
	_, err := s.waitGPU(ctx, 90*time.Second, func(_ *v1alpha1.GPUNode, g *v1alpha1.GPUStatus) bool {
		return appliedAs(g, sc.strategy) && g.Applied.Sizing.PerClaim() && g.Drain == nil &&
			(sc.strategy != v1alpha1.StrategyExclusive || g.Applied.Shim != nil)
	})
	d := time.Since(applied)
	_, g := s.gpuNode(ctx)
	if !s.r.check("status: sized per claim applied", err == nil, "after %.2fs: %s", d.Seconds(), jsonOf(g.Applied)) {
		return sizedDevice{}, false
	}
	fmt.Printf("time %s policy applied after kubectl apply: %.2fs\n", sc.prefix, d.Seconds())
	var dev sizedDevice
	var found bool
	_, err = waitFor(ctx, 30*time.Second, 50*time.Millisecond, func() bool {
		slices, lerr := nodeSlices(ctx, s.c, nodeName)
		if lerr != nil {
			return false
		}
		dev, found, lerr = findSizedDevice(slices, nodeName, s.o.gpuIndex)
		// The device of the case before may still be published until this pass's slices are written.
		return lerr == nil && found && attrString(dev.dev, dra.AttrSizeEnforcement) == sc.enforcement
	}, applied)
	if !s.r.must("ResourceSlice: the node publishes the GPU's sized device", err) {
		return dev, false
	}
	mem, compute := dev.dev.Capacity[dra.CapacityMemory], dev.dev.Capacity[dra.CapacityCompute]
	s.r.check("ResourceSlice: the sized device's memory and compute capacities",
		usableCapacity(g) != nil && mem.Value.Cmp(*usableCapacity(g)) == 0 && mem.Value.Cmp(*g.Memory) < 0 && mem.RequestPolicy != nil && compute.Value.Value() == dra.ComputeCapacity && compute.RequestPolicy != nil &&
			attrString(dev.dev, dra.AttrSizeEnforcement) == sc.enforcement && dev.dev.AllowMultipleAllocations != nil && *dev.dev.AllowMultipleAllocations,
		"%s in pool %s: memory %s (GPU %v, usable %v) %s, compute %s %s, sizeEnforcement %s", dev.dev.Name, dev.pool, mem.Value.String(), g.Memory, usableCapacity(g),
		jsonOf(mem.RequestPolicy), compute.Value.String(), jsonOf(compute.RequestPolicy), attrString(dev.dev, dra.AttrSizeEnforcement))
	_, err = waitFor(ctx, 30*time.Second, 50*time.Millisecond, func() bool { return s.policyReady(ctx, policyName) }, time.Now())
	s.r.must("policy Ready", err)
	return dev, true
}

// startSizedPods creates each pod and its claim, allocates the claim on dev, prepares it through the
// plugin's socket, and starts its workload with its CDI device's edits as that pod's container. Every
// claim is prepared before any workload starts, as a kubelet prepares a pod's claims before its
// containers, and every pod is Running before: the agent names a process's pod from the pods it lists.
func (s *stack) startSizedPods(ctx context.Context, sc sizedCase, dev sizedDevice, kubelet *draKubelet, pods []*sizedPod) bool {
	for _, p := range pods {
		if !s.prepareSizedPod(ctx, sc, dev, kubelet, p) {
			return false
		}
	}
	for _, p := range pods {
		e := p.cdi.edits
		if p.hostile {
			e = withoutLimits(e)
		}
		what := "start " + p.name() + " with its CDI edits"
		if p.hostile {
			what += " less its limits"
		}
		var err error
		// Gated, as a kubelet's container is in its pod's cgroup before its process runs: the workload
		// makes its first CUDA call only once the agent can name its pod.
		p.c, err = s.startWith(p.name(), e, []string{s.o.python, filepath.Join(s.o.repo, "test/gpu/stack/sized_workload.py"), "gated"})
		if !s.r.must(what, err) {
			return false
		}
		if !s.r.must(p.name()+"'s process in its pod", s.inPod(p.pod, p.c.pid())) {
			return false
		}
		if !s.r.must("let "+p.name()+" start", p.c.command("start")) {
			return false
		}
	}
	for _, p := range pods {
		var err error
		p.ready, err = p.c.waitEvent(ctx, readyTimeout, "ready", func(e workloadEvent) bool { return e.Event == "ready" })
		if !s.r.must(p.name()+" ready", err) {
			return false
		}
		// The agent finds a pod's processes by their pids: the workload must be the container's process.
		if !s.r.check(p.name()+": the workload is its container's process", p.ready.PID == p.c.pid(), "workload pid %d, container %d", p.ready.PID, p.c.pid()) {
			return false
		}
	}
	return true
}

// prepareSizedPod creates p's pod (Running, as its kubelet reports it) and claim, allocates the claim on
// dev, prepares it through the plugin's socket and resolves its CDI devices' edits.
func (s *stack) prepareSizedPod(ctx context.Context, sc sizedCase, dev sizedDevice, kubelet *draKubelet, p *sizedPod) bool {
	name := p.pod.Name
	var err error
	p.pod, p.claim, err = claimPod(ctx, s.c, nodeName, name, p.memory, p.compute)
	if p.pod == nil {
		p.pod = &corev1.Pod{}
		p.pod.Name = name
	}
	if !s.r.must("create pod and claim "+name, err) {
		return false
	}
	if !s.r.must("pod "+name+" Running", s.podRunning(ctx, p.pod)) {
		return false
	}
	p.consumed, err = allocate(ctx, s.c, p.claim, p.pod, dev, nodeName)
	if !s.r.must("allocate claim "+name+" as the scheduler would", err) {
		return false
	}
	ids, err := kubelet.prepare(ctx, p.claim, 30*time.Second)
	if !s.r.must("NodePrepareResources "+name, err) {
		return false
	}
	p.prepared = true
	p.cdi, err = resolveCDI(s.cdiDir, ids)
	if !s.r.must("CDI: the spec of "+name+"'s devices "+strings.Join(ids, ","), err) {
		return false
	}
	s.checkSizedEdits(sc, p)
	return true
}

// checkSizedEdits checks the limits the plugin wrote for a claim: its size in MiB and thread percentage
// for the MPS server, its size in bytes for the shim.
func (s *stack) checkSizedEdits(sc sizedCase, p *sizedPod) {
	env := p.cdi.edits.env
	want := map[string]string{
		share.EnvShimMemoryLimit:    fmt.Sprint(p.claimBytes()),
		share.EnvCUDAVisibleDevices: s.gpuUUID,
	}
	if sc.enforcement == dra.EnforcementMPS {
		// The MPS client's limit is its claim less the agent's default context reserve, which NVML
		// counts and the limit does not; the shim reports that limit as the GPU's memory.
		limitMiB := (p.claimBytes() - dra.DefaultContextReserve) >> 20
		want[share.EnvMPSPinnedMemLimit] = fmt.Sprintf("0=%dM", limitMiB)
		want[share.EnvShimMemoryLimit] = fmt.Sprint(limitMiB << 20)
		want[share.EnvMPSActiveThreadPercent] = fmt.Sprint(p.computePercent())
	}
	ok := env[share.EnvLDPreload] != ""
	for k, v := range want {
		ok = ok && env[k] == v
	}
	if sc.enforcement != dra.EnforcementMPS {
		_, capped := env[share.EnvMPSActiveThreadPercent]
		ok = ok && !capped
	}
	s.r.check("CDI: "+p.name()+"'s claim as its limits", ok, "consumed %s: env %v, mounts %d, spec %v", jsonOf(p.consumed), env, len(p.cdi.edits.mounts), p.cdi.files)
}

// withoutLimits are the edits of a pod that drops its claim's limits: no shim, no MPS client settings
// (without a pipe directory a process is no MPS client at all), only the GPU it was given.
func withoutLimits(e edits) edits {
	out := edits{env: map[string]string{}, mounts: e.mounts}
	for k, v := range e.env {
		if k == share.EnvLDPreload || strings.HasPrefix(k, "CUDA_MPS_") || strings.HasPrefix(k, "GPUSHARE_") {
			continue
		}
		out.env[k] = v
	}
	return out
}

// sizedCleanup ends what a case started: its workloads, its prepared claims, its pods and claims.
func (s *stack) sizedCleanup(ctx context.Context, kubelet *draKubelet, pods []*sizedPod) {
	var names []string
	for _, p := range pods {
		s.killWorkload(p.name(), p.c)
		if p.prepared && p.claim != nil {
			_ = kubelet.unprepare(ctx, p.claim)
		}
		names = append(names, p.pod.Name)
	}
	s.r.must("delete the case's pods and claims", deleteClaimPods(ctx, s.c, names))
}

// killWorkload ends c (nil: none started; ended already: nothing to do) and waits for its end.
func (s *stack) killWorkload(name string, c *container) {
	if c == nil || !c.running() {
		return
	}
	c.kill()
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		s.r.check(name+" ends when killed", false, "pid %d still running 30s after SIGKILL", c.pid())
	}
}

// sizedPolicyDeleted deletes the policy: the GPU leaves sizing, no sized device is published, and no
// MPS daemon or scheduler socket is left.
func (s *stack) sizedPolicyDeleted(ctx context.Context) {
	s.r.begin("sized policy deleted")
	start := time.Now()
	if _, err := s.kubectl(ctx, "delete", "gpusharingpolicy", policyName, "--wait=true", "--timeout=60s"); !s.r.must("kubectl delete the policy", err) {
		return
	}
	_, err := s.waitGPU(ctx, 60*time.Second, func(_ *v1alpha1.GPUNode, g *v1alpha1.GPUStatus) bool {
		return appliedAs(g, v1alpha1.StrategyExclusive) && g.Applied.Shim == nil && g.Applied.MPS == nil && !g.Applied.Sizing.PerClaim()
	})
	_, g := s.gpuNode(ctx)
	s.r.check("status: Exclusive, not sized", err == nil, "after %.2fs: %s", time.Since(start).Seconds(), jsonOf(g.Applied))
	_, err = waitFor(ctx, 30*time.Second, 50*time.Millisecond, func() bool {
		slices, lerr := nodeSlices(ctx, s.c, nodeName)
		_, found, ferr := findSizedDevice(slices, nodeName, s.o.gpuIndex)
		return lerr == nil && ferr == nil && !found
	}, start)
	s.r.must("ResourceSlice: no sized device published", err)
	_, err = waitFor(ctx, 15*time.Second, 100*time.Millisecond, func() bool { return len(mpsProcesses()) == 0 }, start)
	s.r.check("GPU: no MPS daemon left", err == nil, "%v", mpsProcesses())
	s.r.check("host: no MPS tmpfs left mounted", len(mountsUnder(s.mpsRoot)) == 0, "%v", mountsUnder(s.mpsRoot))
	sock := filepath.Join(s.schedRoot, s.gpuUUID, "gpushare.sock")
	_, statErr := os.Stat(sock)
	s.r.check("GPU: no scheduler socket left", os.IsNotExist(statErr), "%s: %v", sock, statErr)
	procs := gpuProcesses(ctx, s.o.gpuIndex)
	s.r.check("GPU: no process of this run left on the GPU", !slices.ContainsFunc(procs, func(p int) bool { return p > 0 }), "%v", procs)
}

// usableCapacity is the memory the agent says the sized device offers claims.
func usableCapacity(g *v1alpha1.GPUStatus) *resource.Quantity {
	if s := sizedOf(g); s != nil {
		return s.MemoryCapacity
	}
	return nil
}

func sizedOf(g *v1alpha1.GPUStatus) *v1alpha1.GPUSizedClaims {
	if g == nil {
		return nil
	}
	return g.Sized
}
