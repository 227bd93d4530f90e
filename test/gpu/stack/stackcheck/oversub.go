package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// Two jobs of trainSteps steps with ballastGB of ballast each need ~1.5x the 4Gi budget together.
const (
	trainSteps = "300"
	ballastGB  = "2.75"
)

type trainResult struct {
	SHA256    string `json:"sha256"`
	BallastOK bool   `json:"ballast_ok"`
}

// oversubscription runs two PyTorch jobs on two shim shares of a GPU whose budget is below their sum:
// they must swap, appear in status with their pids, and finish bit-identical to a run without the shim.
func (s *stack) oversubscription(ctx context.Context) {
	s.r.begin("Exclusive with oversubscription (4Gi budget, two PyTorch jobs)")
	train := filepath.Join(s.o.repo, "test/gpu/oversub/train.py")
	base, err := s.baseline(ctx, train)
	if !s.r.must("baseline run without the shim", err) {
		return
	}
	applied := time.Now()
	if !s.r.must("kubectl apply oversubscription.yaml", s.apply(ctx, "oversubscription.yaml")) {
		return
	}
	d, err := waitFor(ctx, 60*time.Second, 10*time.Millisecond, func() bool { return s.policyReady(ctx, policyName) }, applied)
	if !s.r.must("policy Ready", err) {
		return
	}
	fmt.Printf("time oversubscription policy Ready after kubectl apply: %.2fs\n", d.Seconds())
	_, g := s.gpuNode(ctx)
	sh := g.Applied.Shim
	s.r.check("status: the shim's scheduler with the policy's budget", appliedAs(g, v1alpha1.StrategyExclusive) && sh != nil && sh.MemoryBudget != nil && sh.MemoryBudget.Cmp(resource.MustParse("4Gi")) == 0,
		"%s", jsonOf(g.Applied))
	sock := filepath.Join(s.schedRoot, s.gpuUUID, "gpushare.sock")
	_, err = os.Stat(sock)
	s.r.check("GPU: the scheduler socket exists", err == nil, "%s", sock)
	_, err = waitFor(ctx, 20*time.Second, 20*time.Millisecond, func() bool { return healthyCount(s.kubelet.Devices(resShared)) >= 2 }, time.Now())
	if !s.r.check("kubelet: shim shares advertised", err == nil, "%v", s.kubelet.Devices(resShared)) {
		return
	}

	inUse := map[string]bool{}
	var jobs []*container
	defer func() {
		for _, j := range jobs {
			j.kill()
		}
	}()
	for _, name := range []string{"train-a", "train-b"} {
		alloc, err := s.allocate(ctx, resShared, 1, inUse)
		if !s.r.must("Allocate one shim share for "+name, err) {
			return
		}
		e := alloc.resp.Envs
		s.r.check("Allocate: the shim's env for "+name, e["LD_PRELOAD"] != "" && e["GPUSHARE_OVERSUB"] == "1" && e["GPUSHARE_GPU_UUID"] == s.gpuUUID, "%v", e)
		if !s.r.must("admit "+name, s.admitPod(ctx, name, alloc)) {
			return
		}
		c, err := s.startContainer(name, alloc, []string{s.o.python, train, "--steps", trainSteps, "--ballast-gb", ballastGB})
		if !s.r.must("start "+name+" with Allocate's env and mounts", err) {
			return
		}
		jobs = append(jobs, c)
	}
	seen, swapped := s.watchShimClients(ctx, jobs)
	for i, j := range jobs {
		var res trainResult
		err := readJSONLine(ctx, j, 4*time.Minute, &res)
		name := []string{"train-a", "train-b"}[i]
		if !s.r.must(name+" finishes", err) {
			continue
		}
		s.r.check(name+" bit-identical to the run without the shim", res.SHA256 == base.SHA256, "%s vs %s", res.SHA256, base.SHA256)
		s.r.check(name+" ballast intact", res.BallastOK, "%v", res.BallastOK)
		s.r.check("status: "+name+" listed in applied.shim with its pid", seen[j.pid()], "pid %d", j.pid())
		<-j.done
		_ = s.podEnded(ctx, name)
	}
	s.r.check("status: the jobs swapped under the budget", swapped > 0, "swap-outs seen in status: %d", swapped)
}

// watchShimClients polls status.gpus[].applied.shim while the jobs run: which job pids it listed, and
// the most swap-outs it reported.
func (s *stack) watchShimClients(ctx context.Context, jobs []*container) (map[int]bool, int64) {
	seen := map[int]bool{}
	var swapped int64
	for running := true; running; {
		running = false
		for _, j := range jobs {
			select {
			case <-j.done:
			default:
				running = true
			}
		}
		if _, g := s.gpuNode(ctx); g != nil && g.Applied != nil && g.Applied.Shim != nil {
			var total int64
			for _, c := range g.Applied.Shim.Clients {
				seen[int(c.PID)] = true
				total += c.SwapOuts
			}
			swapped = max(swapped, total)
		}
		select {
		case <-ctx.Done():
			return seen, swapped
		case <-time.After(200 * time.Millisecond):
		}
	}
	return seen, swapped
}

// baseline runs the job alone on the GPU without the shim.
func (s *stack) baseline(ctx context.Context, train string) (trainResult, error) {
	var res trainResult
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.o.python, train, "--steps", trainSteps, "--ballast-gb", ballastGB)
	cmd.Env = append(os.Environ(), "CUDA_VISIBLE_DEVICES="+strconv.Itoa(s.o.gpuIndex))
	out, err := cmd.Output()
	if err != nil {
		return res, fmt.Errorf("%w: %s", err, tail(string(out), 400))
	}
	line := strings.SplitN(strings.TrimSpace(string(out)), "\n", 2)[0]
	return res, jsonUnmarshal(line, &res)
}

// policyDeleted deletes the policy: the GPU returns to Exclusive with nothing left running.
func (s *stack) policyDeleted(ctx context.Context) {
	s.r.begin("policy deleted")
	start := time.Now()
	if _, err := s.kubectl(ctx, "delete", "gpusharingpolicy", policyName, "--wait=true", "--timeout=60s"); !s.r.must("kubectl delete the policy", err) {
		return
	}
	_, err := s.waitGPU(ctx, 60*time.Second, func(_ *v1alpha1.GPUNode, g *v1alpha1.GPUStatus) bool {
		return appliedAs(g, v1alpha1.StrategyExclusive) && g.Applied.Shim == nil && g.Applied.MPS == nil
	})
	_, g := s.gpuNode(ctx)
	s.r.check("status: Exclusive, no shim, no MPS", err == nil, "after %.2fs: %s", time.Since(start).Seconds(), jsonOf(g.Applied))
	sock := filepath.Join(s.schedRoot, s.gpuUUID, "gpushare.sock")
	_, statErr := os.Stat(sock)
	s.r.check("GPU: no scheduler socket left", os.IsNotExist(statErr), "%s: %v", sock, statErr)
	s.r.check("GPU: no MPS daemon left", len(mpsProcesses()) == 0, "%v", mpsProcesses())
	procs := gpuProcesses(ctx, s.o.gpuIndex)
	s.r.check("GPU: no process of this run left on the GPU", !slices.ContainsFunc(procs, func(p int) bool { return p > 0 }), "%v", procs)
}
