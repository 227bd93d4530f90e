package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	b "github.com/gpusharing/gpusharing/controllers/testutil/builders"
	"github.com/gpusharing/gpusharing/test/testenv"
)

// floorGenBase keeps the floor's policy generations clear of the real policy's, so an ack from the
// controller's steps can never count for the floor.
const floorGenBase = 1000

// runFloor times what the API server alone needs for one step, with no controller running: a bare
// client limited to the manager's QPS and burst, with as many writers as the manager has resolver
// workers, merge-patches every GPUNode's spec to the entries the resolver writes for that sharing (one
// patch per node, as the resolver does), and the agents ack them as they ack the controller. The time
// ends when every GPU reports the sharing applied: the controller's counterpart is "policy Ready".
func runFloor(ctx context.Context, env *testenv.Env, a *agents, o options, s v1.Sharing, gen int64) (time.Duration, error) {
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = float32(o.qps), o.burst
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		return 0, err
	}
	names := a.nodeNames()
	start := time.Now()
	acked := a.setAckTarget(gen, v1.SharingHash(s))
	work := make(chan string)
	errs := make(chan error, len(names))
	var wg sync.WaitGroup
	for range max(o.resolverWorkers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range work {
				errs <- writeFloorSpec(ctx, c, name, o.gpus, s, gen)
			}
		}()
	}
	for _, n := range names {
		work <- n
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return 0, err
		}
	}
	select {
	case <-acked:
		return time.Since(start), nil
	case <-time.After(o.timeout):
		return 0, fmt.Errorf("floor: agents did not ack every spec within %s", o.timeout)
	}
}

// writeFloorSpec is the resolver's spec write without the resolver: a merge patch of spec.gpus.
func writeFloorSpec(ctx context.Context, c client.Client, name string, gpus int, s v1.Sharing, gen int64) error {
	entries := make([]v1.GPUDesired, gpus)
	for i := range entries {
		entries[i] = b.Desired(name, int32(i), policyName, gen, s)
	}
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"gpus": entries}})
	if err != nil {
		return err
	}
	gn := &v1.GPUNode{}
	gn.Name = name
	if err := c.Patch(ctx, gn, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("floor: patching GPUNode %s spec: %w", name, err)
	}
	return nil
}

func (a *agents) nodeNames() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]string, 0, len(a.latest))
	for n := range a.latest {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
