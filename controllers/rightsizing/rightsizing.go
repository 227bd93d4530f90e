// Package rightsizing recommends the size of each workload's GPU shares from what its pods held and
// used (internal/recommend), and keeps the recommendations in GPUShareRecommendation objects.
//
// Samples come from the GPUNode status the manager already caches: each GPU sized per claim lists its
// claims with their size and the memory their pods hold (status.gpus[].sized.claims), and its consumers'
// SM use (status.gpus[].usage). The agents write nothing more for it, so the cost at scale is a pass over
// the cache per sample interval and one status write per workload when its recommendation moves (the
// histograms are checkpointed at most every checkpoint interval).
package rightsizing

import (
	"context"
	"errors"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/internal/recommend"
)

// +kubebuilder:rbac:groups=gpusharing.io,resources=gpusharerecommendations,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=gpusharing.io,resources=gpusharerecommendations/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=gpusharing.io,resources=gpunodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=resource.k8s.io,resources=resourceclaims,verbs=get
// +kubebuilder:rbac:groups="",resources=pods,verbs=get
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=replicasets,verbs=get
// +kubebuilder:rbac:groups=apps,resources=deployments;statefulsets;daemonsets,verbs=get;list;watch
// +kubebuilder:rbac:groups=batch,resources=jobs,verbs=get
// +kubebuilder:rbac:groups=batch,resources=cronjobs,verbs=get;list;watch

// Options tune the right-sizing.
type Options struct {
	// Config tunes the recommendations.
	Config recommend.Config
	// SampleInterval is how often the GPUNodes are read for samples.
	SampleInterval time.Duration
	// FlushInterval is how often changed recommendations are written.
	FlushInterval time.Duration
	// CheckpointInterval spaces the writes that change only the history, not what a reader sees.
	CheckpointInterval time.Duration
	// MaxNewClaimsPerPass bounds the claims a sample pass reads for the first time (three reads each at
	// most: the claim, its pod, a ReplicaSet or Job); the rest wait for the next passes. 0: no bound.
	MaxNewClaimsPerPass int
	// Driver is the DRA driver whose claims are sized.
	Driver string
	// Clock is the time source; nil means the real clock.
	Clock clock.PassiveClock
}

// DefaultOptions sample every 15 s, write changes every minute and checkpoint every 10 minutes (as VPA);
// a pass reads at most 250 new claims, about 10 s of the manager's default 50 requests per second.
func DefaultOptions() Options {
	return Options{Config: recommend.DefaultConfig(), SampleInterval: 15 * time.Second, FlushInterval: time.Minute,
		CheckpointInterval: 10 * time.Minute, MaxNewClaimsPerPass: 250, Driver: "gpu.gpusharing.io"}
}

// Rightsizer samples the sized claims and writes the recommendations. It runs on the leader only.
type Rightsizer struct {
	// Client reads GPUNodes, recommendations, namespaces and workloads from the cache and writes.
	Client client.Client
	// APIReader reads claims, pods and their owners once each.
	APIReader client.Reader
	Options

	res     *resolver
	mu      sync.Mutex
	entries map[types.NamespacedName]*entry
}

func (r *Rightsizer) clock() clock.PassiveClock {
	if r.Clock == nil {
		return clock.RealClock{}
	}
	return r.Clock
}

// SetupWithManager adds the rightsizer to mgr.
func (r *Rightsizer) SetupWithManager(mgr ctrl.Manager) error {
	if r.SampleInterval <= 0 || r.FlushInterval <= 0 {
		return errors.New("rightsizing: sample and flush intervals must be positive")
	}
	r.res = newResolver(r.APIReader, r.Driver)
	r.entries = map[types.NamespacedName]*entry{}
	return mgr.Add(r)
}

// Start samples and flushes until ctx ends.
func (r *Rightsizer) Start(ctx context.Context) error {
	log := ctrl.LoggerFrom(ctx).WithName("rightsizing")
	ctx = ctrl.LoggerInto(ctx, log)
	sample := time.NewTicker(r.SampleInterval)
	defer sample.Stop()
	flush := time.NewTicker(r.FlushInterval)
	defer flush.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-sample.C:
			if err := r.sample(ctx); err != nil {
				log.Error(err, "Sampling GPUNodes")
			}
		case <-flush.C:
			if err := r.flush(ctx); err != nil {
				log.Error(err, "Writing GPUShareRecommendations")
			}
		}
	}
}

// entry is one target's history and what was last written for it.
type entry struct {
	t target
	w *recommend.Workload
	// claimMemory is the newest claim's size; step and minMemory the sizing of the GPU it is on.
	claimMemory     int64
	step, minMemory int64
	// claims are the claims seen, with when; they count the shares now (metrics).
	claims map[string]time.Time
	// overClaims are the claims seen over their size or refused an allocation at it, each counted once.
	overClaims []string
	// lastSeen is when a claim of the target was last sampled.
	lastSeen time.Time
	// changed: samples came in since the last write.
	changed   bool
	lastWrite time.Time
	written   *v1.GPUShareRecommendationStatus
}

// sample folds every sized claim of every GPUNode into its target's history.
func (r *Rightsizer) sample(ctx context.Context) error {
	var nodes v1.GPUNodeList
	// Read only: the cache's objects are not copied, a pass over 1,000 nodes allocates nothing big.
	if err := r.Client.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return err
	}
	now := r.clock().Now()
	r.res.allow(r.MaxNewClaimsPerPass)
	var errs []error
	for i := range nodes.Items {
		for j := range nodes.Items[i].Status.GPUs {
			if err := r.sampleGPU(ctx, &nodes.Items[i].Status.GPUs[j], now); err != nil {
				errs = append(errs, err)
			}
		}
	}
	r.res.forget(now.Add(-10 * r.SampleInterval))
	return errors.Join(errs...)
}

func (r *Rightsizer) sampleGPU(ctx context.Context, g *v1.GPUStatus, now time.Time) error {
	if g.Sized == nil {
		return nil
	}
	var sizing *v1.Sizing
	if g.Applied != nil {
		sizing = g.Applied.Sizing
	}
	sm := map[types.NamespacedName]int32{}
	smRead := map[types.NamespacedName]bool{}
	if g.Usage != nil {
		for _, c := range g.Usage.Consumers {
			if c.SMUtilization != nil {
				nn := types.NamespacedName{Namespace: c.Namespace, Name: c.Pod}
				sm[nn] += *c.SMUtilization
				smRead[nn] = true
			}
		}
	}
	var errs []error
	for _, c := range g.Sized.Claims {
		if c.Memory == nil {
			continue
		}
		nn := types.NamespacedName{Namespace: c.Namespace, Name: c.Name}
		t, err := r.res.claim(ctx, nn, now)
		if errors.Is(err, ErrNotRecommended) || errors.Is(err, errDeferred) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		e, err := r.entry(ctx, t)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var compute *float64
		for _, p := range c.Pods {
			pn := types.NamespacedName{Namespace: c.Namespace, Name: p}
			if smRead[pn] {
				v := float64(min(sm[pn], 100))
				if compute != nil {
					v += *compute
				}
				compute = &v
			}
		}
		r.mu.Lock()
		e.observe(c, sizing, compute, now)
		r.mu.Unlock()
	}
	return errors.Join(errs...)
}

// observe folds one claim's reading into e.
func (e *entry) observe(c v1.SizedClaimStatus, sizing *v1.Sizing, compute *float64, now time.Time) {
	e.claimMemory = c.Memory.Value()
	e.step, e.minMemory = sizing.Step(), sizing.Min()
	e.claims[c.Name] = now
	e.lastSeen = now
	if c.MemoryUsed != nil {
		used := c.MemoryUsed.Value()
		e.w.ObserveMemory(c.Name, used, now)
		if used > e.claimMemory && !contains(e.overClaims, c.Name) {
			// The pod went over its claim: the agent reports it, or evicts it where the sizing says so.
			e.w.OverClaim(e.claimMemory, now)
			e.bumped(c.Name)
		}
	}
	if c.AllocationsRefused > 0 && !contains(e.overClaims, c.Name) {
		// The shim refused an allocation at the claim's size: the workload needed more, at least what
		// the refused allocation would have brought it to.
		var demand int64
		if c.RefusedDemand != nil {
			demand = c.RefusedDemand.Value()
		}
		e.w.Refused(e.claimMemory, demand, now)
		e.bumped(c.Name)
	}
	if compute != nil {
		e.w.ObserveCompute(min(*compute, 100), now)
	}
	for name, seen := range e.claims {
		if now.Sub(seen) > 2*e.w.Config().PeakWindow {
			delete(e.claims, name)
			e.w.ForgetPod(name)
		}
	}
	e.changed = true
}

// bumped records that claim raised the target (over its size, or refused at it): once per claim.
func (e *entry) bumped(claim string) {
	e.overClaims = append(e.overClaims, claim)
	if len(e.overClaims) > 64 {
		e.overClaims = e.overClaims[len(e.overClaims)-64:]
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// entry is t's entry, loaded from its object's history the first time it is seen.
func (r *Rightsizer) entry(ctx context.Context, t target) (*entry, error) {
	key := types.NamespacedName{Namespace: t.Namespace, Name: t.ObjectName()}
	r.mu.Lock()
	e := r.entries[key]
	r.mu.Unlock()
	if e != nil {
		return e, nil
	}
	e = &entry{t: t, claims: map[string]time.Time{}}
	var obj v1.GPUShareRecommendation
	switch err := r.Client.Get(ctx, key, &obj); {
	case err == nil:
		e.w = recommend.LoadWorkload(r.Config, stateFrom(obj.Status.History))
		e.overClaims = append([]string(nil), obj.Status.History.OverClaims...)
		st := obj.Status
		e.written = &st
		if obj.Status.ClaimMemory != nil {
			e.claimMemory = obj.Status.ClaimMemory.Value()
		}
	case client.IgnoreNotFound(err) == nil:
		e.w = recommend.NewWorkload(r.Config)
	default:
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if prev := r.entries[key]; prev != nil {
		return prev, nil
	}
	r.entries[key] = e
	return e, nil
}

// SampleOnce runs one sample pass now, as the sample ticker does (the benchmark drives passes itself).
func (r *Rightsizer) SampleOnce(ctx context.Context) error { return r.sample(ctx) }

// FlushOnce runs one write pass now, as the write ticker does.
func (r *Rightsizer) FlushOnce(ctx context.Context) error { return r.flush(ctx) }
