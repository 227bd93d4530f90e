package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// Targets from the issue: an MPS policy Ready within 2 s of kubectl apply, and the GPU back to
// Exclusive within 2 s of the last client's exit.
const (
	readyTarget   = 2 * time.Second
	restoreTarget = 2 * time.Second
	policyName    = "stack"
)

var (
	resMPS    = string(share.DefaultConfig().Resources.MPS)
	resShared = string(share.DefaultConfig().Resources.Shared)
)

// scenarioNames are the scenarios --scenarios picks from, in the order they run: mps is Exclusive -> MPS
// -> Exclusive, oversubscription ends by deleting the policy, sized and rightsizing apply and delete their
// own.
var scenarioNames = []string{"mps", "oversubscription", "usage", "sized", "rightsizing"}

func parseScenarios(list string) (map[string]bool, error) {
	if list == "" || list == "all" {
		return nil, nil
	}
	out := map[string]bool{}
	for _, n := range strings.Split(list, ",") {
		n = strings.TrimSpace(n)
		if !slices.Contains(scenarioNames, n) {
			return nil, fmt.Errorf("no scenario %q (there are %s)", n, strings.Join(scenarioNames, ", "))
		}
		out[n] = true
	}
	return out, nil
}

// namedOnly are the scenarios "all" leaves out: rightsizing runs PyTorch five times (about two minutes
// of GPU time), which the whole run's 9 minutes do not leave room for.
var namedOnly = map[string]bool{"rightsizing": true}

// wants says whether the run includes the scenario.
func (o options) wants(name string) bool {
	if o.scenarios == nil {
		return !namedOnly[name]
	}
	return o.scenarios[name]
}

func (s *stack) run(ctx context.Context) {
	if !s.agentUp(ctx) {
		return
	}
	s.health(ctx)
	if s.o.wants("mps") {
		client := s.exclusiveToMPS(ctx)
		s.mpsToExclusive(ctx, client)
	}
	if s.o.wants("oversubscription") {
		s.oversubscription(ctx)
		s.policyDeleted(ctx)
	}
	if s.o.wants("usage") {
		s.perPodUsage(ctx)
	}
	if s.o.wants("sized") {
		s.sizedClaims(ctx)
	}
	if s.o.wants("rightsizing") {
		s.rightsizing(ctx)
	}
	calls, _ := os.ReadFile(s.smiCalls)
	s.r.check("nvidia-smi never called (time-slice policy and compute mode untouched)", len(calls) == 0, "%q", strings.TrimSpace(string(calls)))
}

// agentUp waits for the agent to publish this GPU, Exclusive by default, and its whole-GPU device.
func (s *stack) agentUp(ctx context.Context) bool {
	s.r.begin("agent up on the real GPU")
	d, err := s.waitGPU(ctx, 90*time.Second, func(_ *v1alpha1.GPUNode, g *v1alpha1.GPUStatus) bool {
		return appliedAs(g, v1alpha1.StrategyExclusive)
	})
	if !s.r.check("GPUNode reports the GPU, Exclusive applied", err == nil, "after %.1fs %v", d.Seconds(), err) {
		return false
	}
	_, g := s.gpuNode(ctx)
	s.gpuUUID = g.UUID
	s.r.check("GPU identity from NVML", strings.HasPrefix(g.UUID, "GPU-") && g.Product != "", "%s %s, memory %s", g.UUID, g.Product, g.Memory)
	return true
}

// health checks the agent's Xid watcher registered this GPU (no Xid is injected on a shared machine).
func (s *stack) health(ctx context.Context) {
	s.r.begin("health")
	_, err := s.waitGPU(ctx, 30*time.Second, func(_ *v1alpha1.GPUNode, g *v1alpha1.GPUStatus) bool {
		c := condition(g.Conditions, v1alpha1.ConditionHealthy)
		return c != nil && c.Status == metav1.ConditionTrue && strings.Contains(c.Message, "NVML events watched: Xid")
	})
	_, g := s.gpuNode(ctx)
	s.r.check("Xid watcher registered, GPU Healthy", err == nil, "%s", conditionText(g, v1alpha1.ConditionHealthy))
}

// exclusiveToMPS applies the MPS policy and starts one client with one share's Allocate; the client
// keeps running for the next scenario.
func (s *stack) exclusiveToMPS(ctx context.Context) *container {
	s.r.begin("Exclusive -> MPS (2 replicas, 50% threads, 8Gi pinned)")
	applied := time.Now()
	if !s.r.must("kubectl apply mps.yaml", s.apply(ctx, "mps.yaml")) {
		return nil
	}
	d, err := waitFor(ctx, 60*time.Second, 10*time.Millisecond, func() bool { return s.policyReady(ctx, policyName) }, applied)
	if !s.r.must("policy Ready", err) {
		return nil
	}
	s.r.timed("MPS policy Ready after kubectl apply", d, readyTarget)
	_, g := s.gpuNode(ctx)
	m := g.Applied.MPS
	if !s.r.check("status: MPS applied with the daemon", appliedAs(g, v1alpha1.StrategyMPS) && m != nil && m.PID > 0, "%s", jsonOf(g.Applied)) {
		return nil
	}
	s.r.check("status: the policy's limits", m.ActiveThreadPercentage == 50 && m.PinnedMemoryLimit != nil && m.PinnedMemoryLimit.Cmp(resource.MustParse("8Gi")) == 0 && m.Replicas == 2,
		"threads %d%%, pinned %v, replicas %d", m.ActiveThreadPercentage, m.PinnedMemoryLimit, m.Replicas)
	s.r.check("GPU: the daemon in status runs", alive(int(m.PID)) && slices.Contains(mpsProcesses(), int(m.PID)), "pid %d", m.PID)
	defaults, _ := mpsControl(ctx, s.mpsRoot, s.gpuUUID, "get_default_active_thread_percentage")
	s.r.check("GPU: the daemon's default thread percentage", strings.HasPrefix(defaults, "50"), "%q", defaults)

	_, err = waitFor(ctx, 20*time.Second, 20*time.Millisecond, func() bool { return healthyCount(s.kubelet.Devices(resMPS)) == 2 }, time.Now())
	s.r.check("kubelet: two MPS shares advertised", err == nil, "%v", s.kubelet.Devices(resMPS))

	alloc, err := s.allocate(ctx, resMPS, 1, map[string]bool{})
	if !s.r.must("Allocate one MPS share", err) {
		return nil
	}
	e := alloc.resp.Envs
	s.r.check("Allocate: the share's MPS env", e["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50" && e["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M" && e["CUDA_VISIBLE_DEVICES"] == s.gpuUUID,
		"%v mounts %d", e, len(alloc.resp.Mounts))
	s.checkMPSShm(ctx, alloc, int(m.PID))
	if !s.r.must("admit the pod", s.admitPod(ctx, "mps-client", alloc)) {
		return nil
	}
	// Ask for more than the 8 GiB limit, but never more than the GPU really has free.
	free := gpuFreeMiB(ctx, s.o.gpuIndex)
	want := min(12288, free-2048)
	c, err := s.startContainer("mps-client", alloc, []string{s.o.python, filepath.Join(s.o.repo, "test/gpu/agent/mps_client.py"), fmt.Sprint(want), "-1"})
	if !s.r.must("start the MPS client with Allocate's env and mounts", err) {
		return nil
	}
	var res struct {
		AllocatedMiB int     `json:"allocated_mib"`
		OOM          *string `json:"oom"`
		PID          int     `json:"pid"`
	}
	if err := readJSONLine(ctx, c, 90*time.Second, &res); !s.r.must("client reports", err) {
		c.kill()
		return nil
	}
	s.r.check("GPU: the client is held to the 8Gi pinned limit", res.AllocatedMiB > 0 && res.AllocatedMiB <= 8192 && res.OOM != nil && want > 8192,
		"asked %d MiB, got %d MiB, stopped by %v", want, res.AllocatedMiB, deref(res.OOM))
	clients := mpsClients(ctx, s.mpsRoot, s.gpuUUID)
	s.r.check("GPU: the daemon lists the client", slices.Contains(clients, res.PID), "client pid %d, daemon's clients %v", res.PID, clients)
	_, err = s.waitGPU(ctx, 15*time.Second, func(_ *v1alpha1.GPUNode, g *v1alpha1.GPUStatus) bool {
		return g.Applied != nil && g.Applied.MPS != nil && g.Applied.MPS.Clients >= 1
	})
	_, g = s.gpuNode(ctx)
	s.r.check("status: the daemon's client counted", err == nil, "clients %d", g.Applied.MPS.Clients)
	return c
}

// mpsToExclusive applies Exclusive while the client runs: the GPU must be reported draining until the
// client exits, then the daemon is quit and status says Exclusive.
func (s *stack) mpsToExclusive(ctx context.Context, c *container) {
	s.r.begin("MPS -> Exclusive with a client running (WaitForIdle)")
	if c == nil {
		s.r.check("a running MPS client", false, "the previous scenario did not leave one")
		return
	}
	defer c.kill()
	_, g := s.gpuNode(ctx)
	daemon := int(g.Applied.MPS.PID)
	if !s.r.must("kubectl apply exclusive.yaml", s.apply(ctx, "exclusive.yaml")) {
		return
	}
	_, err := s.waitGPU(ctx, 30*time.Second, func(_ *v1alpha1.GPUNode, g *v1alpha1.GPUStatus) bool {
		return g.Drain != nil && g.Drain.Phase == v1alpha1.DrainPhaseDraining && slices.Contains(g.Drain.Pods, podNamespace+"/mps-client")
	})
	_, g = s.gpuNode(ctx)
	s.r.check("status: the GPU drains, naming the pod", err == nil, "%s", jsonOf(g.Drain))
	// A few seconds with the client still running: the GPU stays draining, MPS still applied.
	time.Sleep(3 * time.Second)
	_, g = s.gpuNode(ctx)
	s.r.check("status: still draining while the client runs", g.Drain != nil && g.Drain.Phase == v1alpha1.DrainPhaseDraining && appliedStrategy(g) == v1alpha1.StrategyMPS && alive(daemon),
		"drain %s, applied %s", jsonOf(g.Drain), appliedStrategy(g))
	// The pod's share stays advertised while the pod holds it (so the node's allocatable keeps counting
	// what its pods' requests count); the free one is not.
	held := s.pods.ids("mps-client")
	advertised := s.kubelet.Devices(resMPS)
	s.r.check("kubelet: of the cordoned GPU's shares only the one the pod holds is advertised",
		len(held) == 1 && healthyCount(advertised) == 1 && advertised[held[0]] == "Healthy", "advertised %v, held %v", advertised, held)

	_ = c.stdin.Close() // the client ends by itself
	select {
	case <-c.done:
	case <-time.After(60 * time.Second):
		s.r.check("client exits", false, "still running 60s after its stdin closed")
		return
	}
	exited := time.Now()
	s.r.must("kubelet: pod ended", s.podEnded(ctx, "mps-client"))
	_, err = waitFor(ctx, 60*time.Second, 10*time.Millisecond, func() bool {
		_, g := s.gpuNode(ctx)
		return g != nil && appliedAs(g, v1alpha1.StrategyExclusive) && g.Drain == nil
	}, exited)
	d := time.Since(exited)
	if !s.r.must("status: Exclusive applied after the client exits", err) {
		return
	}
	s.r.timed("back to Exclusive after the last client exits", d, restoreTarget)
	s.r.check("GPU: the MPS daemon was quit", !alive(daemon) && len(mpsProcesses()) == 0, "daemon %d alive %v, MPS processes %v", daemon, alive(daemon), mpsProcesses())
	shm := filepath.Join(s.mpsRoot, s.gpuUUID, "shm")
	_, statErr := os.Stat(shm)
	s.r.check("host: the GPU's /dev/shm tmpfs unmounted and removed", os.IsNotExist(statErr) && len(mountsUnder(s.mpsRoot)) == 0, "stat %v, mounts under the MPS root %v", statErr, mountsUnder(s.mpsRoot))
	_, err = waitFor(ctx, 30*time.Second, 50*time.Millisecond, func() bool { return s.policyReady(ctx, policyName) }, time.Now())
	s.r.must("policy Ready", err)
}

func (s *stack) apply(ctx context.Context, file string) error {
	data, err := os.ReadFile(filepath.Join(s.o.repo, "test/gpu/stack/policies", file))
	if err != nil {
		return err
	}
	path := filepath.Join(s.o.work, file)
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(string(data), "GPU_INDEX", fmt.Sprint(s.o.gpuIndex))), 0o644); err != nil {
		return err
	}
	_, err = s.kubectl(ctx, "apply", "-f", path)
	return err
}

// readJSONLine waits for the container's first stdout line and decodes it.
func readJSONLine(ctx context.Context, c *container, timeout time.Duration, v any) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if f, err := os.Open(c.out); err == nil {
			line, err := bufio.NewReader(f).ReadString('\n')
			_ = f.Close()
			if err == nil {
				return json.Unmarshal([]byte(line), v)
			}
		}
		select {
		case <-c.done:
			if f, err := os.ReadFile(c.out); err == nil && len(f) > 0 {
				return json.Unmarshal([]byte(strings.SplitN(string(f), "\n", 2)[0]), v)
			}
			stderr, _ := os.ReadFile(c.errf)
			return fmt.Errorf("exited (%v) without output: %s", c.err, tail(string(stderr), 600))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("no output within %s", timeout)
}

func appliedAs(g *v1alpha1.GPUStatus, want v1alpha1.Strategy) bool {
	c := condition(g.Conditions, v1alpha1.ConditionApplied)
	return appliedStrategy(g) == want && c != nil && c.Status == metav1.ConditionTrue
}

func appliedStrategy(g *v1alpha1.GPUStatus) v1alpha1.Strategy {
	if g == nil || g.Applied == nil {
		return ""
	}
	return g.Applied.Strategy
}

func condition(cs []metav1.Condition, t string) *metav1.Condition {
	for i := range cs {
		if cs[i].Type == t {
			return &cs[i]
		}
	}
	return nil
}

func conditionText(g *v1alpha1.GPUStatus, t string) string {
	if g == nil {
		return "no GPU status"
	}
	c := condition(g.Conditions, t)
	if c == nil {
		return "no " + t + " condition"
	}
	return fmt.Sprintf("%s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message)
}

func healthyCount(devs map[string]string) int {
	n := 0
	for _, h := range devs {
		if h == "Healthy" {
			n++
		}
	}
	return n
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func deref(s *string) string {
	if s == nil {
		return "<nothing>"
	}
	return *s
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
