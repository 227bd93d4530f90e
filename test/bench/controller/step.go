package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/gpunode"
	"github.com/gpusharing/gpusharing/controllers/policy"
	b "github.com/gpusharing/gpusharing/controllers/testutil/builders"
	"github.com/gpusharing/gpusharing/test/testenv"
)

const policyName = "bench"

// step is one policy write whose roll-out is timed.
type step struct {
	name    string
	sharing v1.Sharing
	create  bool
}

type result struct {
	name             string
	specs, ready     time.Duration
	resolver, status latency
	// cpu is the CPU time the manager process used during the step.
	cpu time.Duration
	// gen is the policy generation the step waited for; writes the API server's count of the step's writes.
	gen    int64
	writes string
}

func (s step) run(ctx context.Context, env *testenv.Env, a *agents, m *manager, o options) (result, error) {
	before, err := scrape(m.metrics)
	if err != nil {
		return result{}, err
	}
	cpuBefore := m.cpu()
	start := time.Now()
	gen, err := s.write(ctx, env.Client, o)
	if err != nil {
		return result{}, err
	}
	reached := a.setTarget(gen, v1.SharingHash(s.sharing))
	r := result{name: s.name, gen: gen}
	select {
	case <-reached:
		r.specs = time.Since(start)
	case <-time.After(o.timeout):
		return r, fmt.Errorf("specs not all written within %s", o.timeout)
	}
	if err := waitReady(ctx, env, o, gen, o.timeout); err != nil {
		return r, err
	}
	r.ready = time.Since(start)
	after, err := scrape(m.metrics)
	if err != nil {
		return r, err
	}
	r.cpu = m.cpu() - cpuBefore
	r.resolver = after.since(before, gpunode.ControllerName)
	r.status = after.since(before, policy.ControllerName)
	return r, nil
}

// write creates the policy or patches its sharing, and returns the generation to wait for.
func (s step) write(ctx context.Context, c client.Client, o options) (int64, error) {
	if s.create {
		p := b.Policy(policyName, b.WithNodeLabels(poolLabel, poolValue), b.WithSharing(s.sharing),
			b.WithMaxUnavailable(intstr.Parse(o.maxUnavailable)))
		p.Generation = 0
		if err := c.Create(ctx, p); err != nil {
			return 0, err
		}
		return p.Generation, nil
	}
	// A JSON patch replaces sharing whole; a merge patch would keep the old strategy's block.
	patch, err := json.Marshal([]map[string]any{{"op": "replace", "path": "/spec/sharing", "value": s.sharing}})
	if err != nil {
		return 0, err
	}
	p := &v1.GPUSharingPolicy{}
	p.Name = policyName
	if err := c.Patch(ctx, p, client.RawPatch(types.JSONPatchType, patch)); err != nil {
		return 0, err
	}
	return p.Generation, nil
}

func (r result) print() {
	fmt.Printf("\n%s\n", r.name)
	fmt.Printf("  all specs written   %8.2fs\n", r.specs.Seconds())
	fmt.Printf("  policy Ready        %8.2fs\n", r.ready.Seconds())
	fmt.Printf("  manager CPU time    %8.2fs\n", r.cpu.Seconds())
	fmt.Printf("  %-18s  %6d reconciles  p50 %7.2fms  p99 %7.2fms\n", gpunode.ControllerName, r.resolver.count, r.resolver.p50*1000, r.resolver.p99*1000)
	fmt.Printf("  %-18s  %6d reconciles  p50 %7.2fms  p99 %7.2fms\n", policy.ControllerName, r.status.count, r.status.p50*1000, r.status.p99*1000)
	fmt.Printf("  API server          %s\n", r.writes)
}

// waitReady waits for the policy to report generation gen Ready with every GPU ready.
func waitReady(ctx context.Context, env *testenv.Env, o options, gen int64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		p := &v1.GPUSharingPolicy{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: policyName}, p); err != nil {
			return err
		}
		if p.Status.ObservedGeneration == gen && meta.IsStatusConditionTrue(p.Status.Conditions, v1.ConditionReady) &&
			int(p.Status.ReadyGPUs) == o.nodes*o.gpus {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("policy not Ready within %s: %+v", timeout, p.Status)
		}
		// Every poll is a request the API server serves during the timed step: 100ms keeps them few and
		// the reading within 0.1s.
		time.Sleep(100 * time.Millisecond)
	}
}
