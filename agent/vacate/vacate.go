// Package vacate empties one GPU of its pods: it finds the pods that hold the GPU's devices through the
// kubelet's PodResources API (device plugin pods) and the pods holding DRA ResourceClaims on them
// (Claims), then waits for them to end (WaitForIdle) or evicts them through the Eviction API so
// PodDisruptionBudgets hold (Evict), until a timeout. Every step goes to a progress callback, so the agent
// can show it in GPUNode status. Stopping new pods from landing on the GPU is the caller's step before
// Vacate (deviceplugin.Manager.Cordon; a draining GPU's DRA devices leave its ResourceSlices).
//
// A drain (the API's spec.drain and status.gpus[].drain) is agent/node's state machine around a
// disruptive change: cordon, vacate, apply, uncordon (drainfsm.go). This package is its vacate step
// only; its StepKind values name that step's events, not the drain's phases.
package vacate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

var (
	// ErrTimeout: pods still used the GPU when the timeout passed; Result.Remaining names them.
	ErrTimeout = errors.New("timed out")
	// ErrPodResourcesUnavailable: the kubelet's PodResources API could not be listed.
	ErrPodResourcesUnavailable = errors.New("kubelet PodResources API unavailable")
	// ErrClaimsUnavailable: the ResourceClaims could not be listed.
	ErrClaimsUnavailable = errors.New("ResourceClaims unavailable")
	// ErrEvictionFailed: the API server refused an eviction for a reason waiting will not fix (not a
	// PodDisruptionBudget), for example RBAC.
	ErrEvictionFailed = errors.New("eviction failed")
	// ErrInvalidRequest: the request names no GPU, an unknown mode, or Evict without an API client.
	ErrInvalidRequest = errors.New("invalid request to vacate a GPU")
)

// DefaultPollInterval is how often Vacate looks at the kubelet and the API server again.
const DefaultPollInterval = time.Second

// PodRef names a pod.
type PodRef struct {
	Namespace string
	Name      string
}

func (p PodRef) String() string { return p.Namespace + "/" + p.Name }

// StepKind is one kind of event while the GPU is vacated (not a phase of agent/node's drain).
type StepKind string

const (
	// StepListed: Vacate looked for the GPU's pods the first time; Pods are the ones found.
	StepListed StepKind = "Listed"
	// StepWaiting: pods still use the GPU (reported when the set changes).
	StepWaiting StepKind = "Waiting"
	// StepEvicted: the API server accepted the eviction of Pods[0], or Pods[0] was already terminating
	// (evicted before, perhaps by an agent process killed since) and is waited for, not evicted again.
	StepEvicted StepKind = "Evicted"
	// StepEvictionBlocked: a PodDisruptionBudget refused the eviction of Pods[0] for now (HTTP 429); the
	// eviction is retried on every poll. Reported again only when the API server's message changes.
	StepEvictionBlocked StepKind = "EvictionBlocked"
	// StepListFailed: the PodResources API could not be listed; Vacate retries until the timeout.
	StepListFailed StepKind = "ListFailed"
	// StepVacated: no pod uses the GPU any more; Vacate succeeded.
	StepVacated StepKind = "Vacated"
	// StepTimedOut: the timeout passed; Pods still use the GPU.
	StepTimedOut StepKind = "TimedOut"
	// StepFailed: Vacate stopped on an error waiting cannot fix.
	StepFailed StepKind = "Failed"
)

// Step is one thing Vacate did or saw.
type Step struct {
	Time    time.Time
	Kind    StepKind
	Pods    []PodRef
	Message string
}

// Request names the GPU to empty and how.
type Request struct {
	// GPUUUID is the physical GPU; devices <uuid> and <uuid>::<n> belong to it.
	GPUUUID string
	// MIGUUIDs are its MIG devices, whose pods count as the GPU's too.
	MIGUUIDs []string
	// GPUIndex is the GPU's NVML index: DRA device names carry it (Claims).
	GPUIndex int32
	// Mode is WaitForIdle (default when empty) or Evict.
	Mode v1alpha1.DrainMode
	// ClaimScope, when set, narrows the DRA claims whose pods count to those it names (a fixed-layout
	// change takes only some of a GPU's claims); nil: every claim on the GPU. It does not narrow the
	// device plugin's pods: MIGUUIDs does.
	ClaimScope *ClaimScope
	// Timeout bounds Vacate; 0 means look once and fail if any pod uses the GPU.
	Timeout time.Duration
	// Progress receives every step as it happens (optional). It runs on Vacate's goroutine.
	Progress func(Step)
}

// Result is what Vacate did.
type Result struct {
	GPUUUID string
	Mode    v1alpha1.DrainMode
	Steps   []Step
	// Found are the pods that used the GPU at the first look.
	Found []PodRef
	// Evicted are the pods whose eviction the API server accepted.
	Evicted []PodRef
	// Remaining are the pods that still used the GPU at the end; empty on success.
	Remaining []PodRef
	Duration  time.Duration
}

// Vacater empties GPUs of one node of their pods.
type Vacater struct {
	// PodResources lists the kubelet's pods and their devices (see DialPodResources): the device
	// plugin's pods. Nil on a node that serves DRA only.
	PodResources PodResourcesLister
	// Claims lists the pods holding DRA ResourceClaims on the GPU (dra.ClaimHolders): a pod counts when
	// either source names it. Nil on a node without DRA.
	Claims ClaimHolders
	// Evictor evicts pods (Evict only; see NewEvictor).
	Evictor Evictor
	// Pods reads pods to tell an ended pod (Succeeded, Failed or gone) from a running one, since the
	// kubelet may list a finished pod's devices for a while. Pass an uncached reader
	// (manager.GetAPIReader()) so the agent does not cache every pod of the cluster. Without it only the
	// kubelet's list counts.
	Pods client.Reader
	// NodeName is the node whose kubelet PodResources lists. A pod the API server binds to another node is
	// never evicted (a same-named pod recreated elsewhere); evictions carry the pod's uid as a
	// precondition. Empty skips the node check.
	NodeName string
	// PollInterval defaults to DefaultPollInterval.
	PollInterval time.Duration
	// Clock decides the polls and the timeout; nil means the real clock.
	Clock clock.Clock
}

// Vacate empties the GPU as req says. It returns nil once no pod uses the GPU; otherwise an error that
// wraps ErrTimeout, ErrEvictionFailed, ErrInvalidRequest or ctx's error, with the Result filled in
// either way.
func (v *Vacater) Vacate(ctx context.Context, req Request) (Result, error) {
	mode := req.Mode
	if mode == "" {
		mode = v1alpha1.DrainWaitForIdle
	}
	c := v.Clock
	if c == nil {
		c = clock.RealClock{}
	}
	r := &run{v: v, req: req, res: Result{GPUUUID: req.GPUUUID, Mode: mode}, clock: c, now: c.Now}
	start := r.now()
	switch {
	case req.GPUUUID == "":
		return r.res, fmt.Errorf("%w: no GPU uuid", ErrInvalidRequest)
	case mode != v1alpha1.DrainWaitForIdle && mode != v1alpha1.DrainEvict:
		return r.res, fmt.Errorf("%w: unknown mode %q", ErrInvalidRequest, mode)
	case mode == v1alpha1.DrainEvict && v.Evictor == nil:
		return r.res, fmt.Errorf("%w: Evict needs an Evictor", ErrInvalidRequest)
	case v.PodResources == nil && v.Claims == nil:
		return r.res, fmt.Errorf("%w: neither a PodResources client nor a ResourceClaim source", ErrInvalidRequest)
	}
	err := r.loop(ctx, mode, start)
	r.res.Duration = r.now().Sub(start)
	return r.res, err
}

// run is one Vacate call's state.
type run struct {
	v     *Vacater
	req   Request
	res   Result
	now   func() time.Time
	clock clock.Clock

	evicted    map[PodRef]bool
	blockedMsg map[PodRef]string
	// pods is what the API server last said of each listed pod (uid and node, for the eviction).
	pods        map[PodRef]apiPod
	lastWaiting string
	lastListErr error
}

func (r *run) step(ctx context.Context, kind StepKind, pods []PodRef, format string, args ...any) {
	s := Step{Time: r.now(), Kind: kind, Pods: append([]PodRef(nil), pods...), Message: fmt.Sprintf(format, args...)}
	r.res.Steps = append(r.res.Steps, s)
	logr.FromContextOrDiscard(ctx).Info("Vacating GPU", "gpu", r.req.GPUUUID, "step", string(kind), "pods", podList(pods), "message", s.Message)
	if r.req.Progress != nil {
		r.req.Progress(s)
	}
}

func (r *run) loop(ctx context.Context, mode v1alpha1.DrainMode, start time.Time) error {
	interval := r.v.PollInterval
	if interval <= 0 {
		interval = DefaultPollInterval
	}
	deadline := start.Add(r.req.Timeout)
	r.evicted = map[PodRef]bool{}
	r.blockedMsg = map[PodRef]string{}
	r.pods = map[PodRef]apiPod{}
	first := true
	var pods []PodRef
	for {
		listed, err := r.podsUsingGPU(ctx)
		switch {
		case err != nil:
			if r.lastListErr == nil || r.lastListErr.Error() != err.Error() {
				r.step(ctx, StepListFailed, nil, "%v", err)
			}
			r.lastListErr = err
		default:
			r.lastListErr = nil
			pods = listed
			if first {
				first = false
				r.res.Found = pods
				r.step(ctx, StepListed, pods, "%d pods use GPU %s (mode %s)", len(pods), r.req.GPUUUID, mode)
			}
			if len(pods) == 0 {
				r.res.Remaining = nil
				r.step(ctx, StepVacated, nil, "no pod uses GPU %s", r.req.GPUUUID)
				return nil
			}
			if mode == v1alpha1.DrainEvict {
				if err := r.evictAll(ctx, pods, deadline); err != nil {
					r.res.Remaining = pods
					r.step(ctx, StepFailed, pods, "%v", err)
					return err
				}
			}
			if w := podList(pods); w != r.lastWaiting {
				r.lastWaiting = w
				r.step(ctx, StepWaiting, pods, "waiting for %d pods to end: %s", len(pods), w)
			}
		}

		wait := min(interval, deadline.Sub(r.now()))
		if wait <= 0 {
			return r.timedOut(ctx, pods)
		}
		t := r.clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			r.res.Remaining = pods
			return fmt.Errorf("vacating GPU %s stopped: %w", r.req.GPUUUID, ctx.Err())
		case <-t.C():
		}
	}
}

func (r *run) timedOut(ctx context.Context, pods []PodRef) error {
	r.res.Remaining = pods
	var blocked []string
	for _, p := range pods {
		if m, ok := r.blockedMsg[p]; ok {
			blocked = append(blocked, fmt.Sprintf("%s (%s)", p, m))
		}
	}
	msg := fmt.Sprintf("%d pods still use GPU %s after %s: %s", len(pods), r.req.GPUUUID, r.req.Timeout, podList(pods))
	if r.res.Found == nil && r.lastListErr != nil {
		msg = fmt.Sprintf("could not list the pods of GPU %s within %s", r.req.GPUUUID, r.req.Timeout)
	}
	if len(blocked) > 0 {
		msg += "; eviction refused for now (a PodDisruptionBudget answers 429) for " + strings.Join(blocked, ", ")
	}
	r.step(ctx, StepTimedOut, pods, "%s", msg)
	if r.lastListErr != nil {
		return fmt.Errorf("%w: %s: %w", ErrTimeout, msg, r.lastListErr)
	}
	return fmt.Errorf("%w: %s", ErrTimeout, msg)
}

func podList(pods []PodRef) string {
	s := make([]string, len(pods))
	for i, p := range pods {
		s[i] = p.String()
	}
	return strings.Join(s, ", ")
}
