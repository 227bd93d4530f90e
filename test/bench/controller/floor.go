package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/gate"
	"github.com/gpusharing/gpusharing/controllers/resolve"
	b "github.com/gpusharing/gpusharing/controllers/testutil/builders"
	"github.com/gpusharing/gpusharing/test/testenv"
)

// runFloor times what the API server alone needs for one step, with no controller running: a bare
// client limited to the manager's QPS and burst, with -floor-writers writers admitted by the adaptive
// gate the manager's resolver uses (controllers/gate, between -floor-min-writers and -floor-writers,
// the same latency target: more writes in flight than the server serves only slow each one down, and
// fewer leave it idle between them, so a floor without the gate, or with the manager's one write in
// flight, would not be a lower bound), merge-patches every GPUNode's spec to the entries the resolver writes for that sharing (one
// patch per node, as the resolver does, with the policy generation gen the controller's step writes),
// and the agents ack them as they ack the controller. The time ends when every GPU reports the sharing
// applied: the controller's counterpart is "policy Ready". No manager runs meanwhile, so no other write
// can count for the floor.
func runFloor(ctx context.Context, env *testenv.Env, a *agents, o options, s v1.Sharing, gen int64) (floorResult, error) {
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = float32(o.qps), o.burst
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		return floorResult{}, err
	}
	stopWatchers, err := startWatchers(ctx, env, o.floorWatchers)
	if err != nil {
		return floorResult{}, err
	}
	defer stopWatchers()
	before, err := scrapeWrites(ctx, env)
	if err != nil {
		return floorResult{}, err
	}
	names := a.nodeNames()
	var latMu sync.Mutex
	lat := make([]time.Duration, 0, len(names))
	start := time.Now()
	acked := a.setAckTarget(gen, v1.SharingHash(s))
	work := make(chan string)
	errs := make(chan error, len(names))
	gateOpts := floorGate(o)
	workers := gateOpts.Max
	g := gate.New(gateOpts)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range work {
				g.Acquire()
				t0 := time.Now()
				err := writeFloorSpec(ctx, c, name, o.gpus, s, gen)
				d := time.Since(t0)
				g.Observe(d)
				g.Release()
				latMu.Lock()
				lat = append(lat, d)
				latMu.Unlock()
				errs <- err
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
			return floorResult{}, err
		}
	}
	select {
	case <-acked:
	case <-time.After(o.timeout):
		return floorResult{}, fmt.Errorf("floor: agents did not ack every spec within %s", o.timeout)
	}
	r := floorResult{took: time.Since(start)}
	if after, err := scrapeWrites(ctx, env); err == nil {
		r.writes = after.since(before) + "; " + objectSize(ctx, env)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	if len(lat) > 0 {
		r.patchP50, r.patchP99 = lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)]
	}
	return r, nil
}

// floorGate is the floor's gate: between -floor-min-writers and -floor-writers writes in flight, adapting
// to -write-latency-target as the manager's gate does, or always -floor-writers where the target is 0.
func floorGate(o options) gate.Options {
	most := max(o.floorWriters, 1)
	if o.writeLatencyTarget <= 0 {
		return gate.Options{Min: most, Max: most}
	}
	return gate.Options{Min: min(max(o.floorMinWriters, 1), most), Max: most, Target: o.writeLatencyTarget}
}

// startWatchers starts n informers on GPUNodes that do nothing with what they receive, each with its own
// connection, and waits until they have listed: a floor run with them tells what a watcher of every
// GPUNode (the manager is one) costs the API server, apart from anything the manager writes.
func startWatchers(ctx context.Context, env *testenv.Env, n int) (stop func(), err error) {
	ctx, cancel := context.WithCancel(ctx)
	for range n {
		ca, err := cache.New(fastConfig(env), cache.Options{Scheme: env.Scheme})
		if err != nil {
			cancel()
			return nil, err
		}
		if _, err := ca.GetInformer(ctx, &v1.GPUNode{}); err != nil {
			cancel()
			return nil, err
		}
		go func() { _ = ca.Start(ctx) }()
		if !ca.WaitForCacheSync(ctx) {
			cancel()
			return nil, fmt.Errorf("a passive GPUNode watcher did not sync")
		}
	}
	return cancel, nil
}

// floorResult is one floor: the time until every GPU was acked, and the latency of the bare spec patches
// (the API server's share of a resolver reconcile, measured in the same run).
type floorResult struct {
	took               time.Duration
	patchP50, patchP99 time.Duration
	writes             string
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
	// Answered with metadata only, as the resolver's patch is (controllers/gpunode patchSpec): a floor that
	// had the whole object encoded would cost the API server more than the controller's writes do.
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(v1.GroupVersion.WithKind("GPUNode"))
	m.Name = name
	if err := patchRetrying(ctx, c, m, patch); err != nil {
		return fmt.Errorf("floor: patching GPUNode %s spec: %w", name, err)
	}
	return nil
}

// patchRetrying merge-patches gn, retrying a few times on errors other than NotFound and Invalid, as the
// resolver's work queue would: a loaded API server now and then drops a connection.
func patchRetrying(ctx context.Context, c client.Client, gn client.Object, patch []byte) error {
	var err error
	for try := 0; try < 5; try++ {
		if err = c.Patch(ctx, gn, client.RawPatch(types.MergePatchType, patch)); err == nil || apierrors.IsNotFound(err) || apierrors.IsInvalid(err) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
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

// snapshot copies every GPUNode as the agents last saw it, for restore.
func (a *agents) snapshot() map[string]*v1.GPUNode {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]*v1.GPUNode, len(a.latest))
	for n, gn := range a.latest {
		out[n] = gn.DeepCopy()
	}
	return out
}

func (a *agents) latestCopy(name string) *v1.GPUNode {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.latest[name].DeepCopy()
}

// restore puts every GPUNode's spec and status back to the snapshot taken before the floor, so the
// controller's step starts from exactly the state it left (as found, for the first step): the resolver
// finds its own spec in place and writes nothing when it starts. It is not timed and uses the fast client.
func restore(ctx context.Context, env *testenv.Env, a *agents, snap map[string]*v1.GPUNode, timeout time.Duration) error {
	c, err := fastClient(env)
	if err != nil {
		return err
	}
	work := make(chan string)
	errs := make(chan error, len(snap))
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range work {
				errs <- restoreNode(ctx, c, a, snap[name])
			}
		}()
	}
	for name := range snap {
		work <- name
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	deadline := time.Now().Add(timeout)
	pending := make(map[string]bool, len(snap))
	for name := range snap {
		pending[name] = true
	}
	for {
		// Only the nodes not yet seen restored are checked again, and without copies: at 10,000 nodes a
		// full scan of copies every 100ms would take a good part of a core from the API server.
		a.mu.Lock()
		for name := range pending {
			if restored(a.latest[name], snap[name]) {
				delete(pending, name)
			}
		}
		a.mu.Unlock()
		done := len(snap) - len(pending)
		if done == len(snap) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("restore: %d of %d GPUNodes back after %s", done, len(snap), timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func restoreNode(ctx context.Context, c client.Client, a *agents, want *v1.GPUNode) error {
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"gpus": want.Spec.GPUs}})
	if err != nil {
		return err
	}
	gn := &v1.GPUNode{}
	gn.Name = want.Name
	if err := patchRetrying(ctx, c, gn, patch); err != nil {
		return fmt.Errorf("restore: patching GPUNode %s spec: %w", want.Name, err)
	}
	// The status goes back too: an agent does not undo an applied sharing when its entry disappears.
	for try := 0; try < 100; try++ {
		cur := gn.DeepCopy()
		if try > 0 {
			cur = a.latestCopy(want.Name)
		}
		if restored(cur, want) {
			return nil
		}
		cur.Status = *want.Status.DeepCopy()
		// The spec patch moved the generation: a status that still reported the snapshot's would make
		// every agent write an ack of the new generation, and those writes would land in the next timed
		// phase.
		cur.Status.ObservedGeneration = cur.Generation
		err := c.Status().Update(ctx, cur)
		if err == nil {
			return nil
		}
		if !apierrors.IsConflict(err) {
			return fmt.Errorf("restore: writing GPUNode %s status: %w", want.Name, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("restore: GPUNode %s status kept conflicting", want.Name)
}

// restored says whether gn's spec and applied sharing are the snapshot's, with the status observing the
// current generation (so no agent has an ack left to write).
func restored(gn, want *v1.GPUNode) bool {
	if gn == nil || !equality.Semantic.DeepEqual(gn.Spec.GPUs, want.Spec.GPUs) || gn.Status.ObservedGeneration != gn.Generation {
		return false
	}
	for i := range want.Status.GPUs {
		w := &want.Status.GPUs[i]
		g := resolve.FindGPU(gn.Status.GPUs, w.UUID)
		if g == nil || (g.Applied == nil) != (w.Applied == nil) {
			return false
		}
		if w.Applied != nil && (g.Applied.SpecHash != w.Applied.SpecHash || g.Applied.PolicyGeneration != w.Applied.PolicyGeneration) {
			return false
		}
	}
	return true
}
