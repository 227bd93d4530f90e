package rightsizing

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
)

// PodClaimNameAnnotation is set by the kube-controller-manager on a claim it creates from a pod's
// ResourceClaimTemplate: the name of the claim in the pod's spec.
const PodClaimNameAnnotation = "resource.kubernetes.io/pod-claim-name"

// ErrNotRecommended marks a claim nothing is recommended for: not made from a template for a pod, or
// holding no request of the driver.
var ErrNotRecommended = errors.New("not a claim made from a template for a pod")

// target is what a claim's samples are folded into: one sized request of one workload's claims.
type target struct {
	Namespace string
	Workload  v1.WorkloadRef
	PodClaim  string
	Request   string
}

// ObjectName is the name of the target's GPUShareRecommendation: readable where it fits, otherwise cut
// and made unique by a hash.
func (t target) ObjectName() string {
	n := strings.ToLower(string(t.Workload.Kind)) + "-" + t.Workload.Name + "-" + t.PodClaim
	if t.Request != t.PodClaim {
		n += "-" + t.Request
	}
	if len(n) <= 253 {
		return n
	}
	h := sha256.Sum256([]byte(n))
	return n[:240] + "-" + hex.EncodeToString(h[:])[:12]
}

// PodNamePattern is the RE2 pattern of the names the workload's pods get from their controllers; the
// admission policy finds a new claim's workload by its owner pod's name with it. Names the controllers
// cut short (a Deployment name over 47 characters) are not matched.
func PodNamePattern(w v1.WorkloadRef) string {
	n := regexp.QuoteMeta(w.Name)
	const suffix = "[a-z0-9]{5}"
	switch w.Kind {
	case v1.WorkloadDeployment:
		return "^" + n + "-[a-z0-9]{1,10}-" + suffix + "$"
	case v1.WorkloadReplicaSet, v1.WorkloadDaemonSet:
		return "^" + n + "-" + suffix + "$"
	case v1.WorkloadStatefulSet:
		return "^" + n + "-[0-9]+$"
	case v1.WorkloadJob:
		return "^" + n + "-([0-9]+-)?" + suffix + "$"
	case v1.WorkloadCronJob:
		return "^" + n + "-[0-9]+-([0-9]+-)?" + suffix + "$"
	default:
		return "^" + n + "$"
	}
}

// errDeferred marks a claim left for a later pass: this pass has read its share of new claims.
var errDeferred = errors.New("deferred to a later pass")

// resolver maps a claim to its target: the claim's owner pod, the pod's top owner. Claims and owners
// are read once from the API server (not cached: a cache of every pod and ReplicaSet of the cluster
// would cost far more than a read per new claim) and remembered while they are seen.
type resolver struct {
	reader client.Reader
	driver string

	mu     sync.Mutex
	claims map[types.NamespacedName]resolved
	owners map[string]v1.WorkloadRef
	// budget is how many new claims this pass may still read; below zero, no limit.
	budget int
}

// allow sets how many new claims the next pass may read (n <= 0: no limit), so that after a restart at
// fleet scale, reading every claim once is spread over passes at the client's rate, and each pass still
// ends in time for the writes.
func (r *resolver) allow(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.budget = n
	if n <= 0 {
		r.budget = -1
	}
}

type resolved struct {
	t    target
	err  error
	seen time.Time
}

func newResolver(r client.Reader, driver string) *resolver {
	return &resolver{reader: r, driver: driver, claims: map[types.NamespacedName]resolved{}, owners: map[string]v1.WorkloadRef{}}
}

// claim is the target of the claim ns/name, or an error (ErrNotRecommended for claims that have none).
func (r *resolver) claim(ctx context.Context, nn types.NamespacedName, now time.Time) (target, error) {
	r.mu.Lock()
	c, ok := r.claims[nn]
	if ok {
		c.seen = now
		r.claims[nn] = c
	}
	deferred := !ok && r.budget == 0
	if !ok && r.budget > 0 {
		r.budget--
	}
	r.mu.Unlock()
	if ok {
		return c.t, c.err
	}
	if deferred {
		return target{}, errDeferred
	}
	t, err := r.read(ctx, nn)
	if err != nil && !errors.Is(err, ErrNotRecommended) {
		return t, err // not remembered: read again next time
	}
	r.mu.Lock()
	r.claims[nn] = resolved{t: t, err: err, seen: now}
	r.mu.Unlock()
	return t, err
}

// forget drops the claims not seen since before.
func (r *resolver) forget(before time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for nn, c := range r.claims {
		if c.seen.Before(before) {
			delete(r.claims, nn)
		}
	}
	// ReplicaSets and Jobs come and go with rollouts and runs: rather than track each, the owners are
	// read again once they outnumber the claims well.
	if len(r.owners) > 2*len(r.claims)+1000 {
		clear(r.owners)
	}
}

func (r *resolver) read(ctx context.Context, nn types.NamespacedName) (target, error) {
	var claim resourcev1.ResourceClaim
	if err := r.reader.Get(ctx, nn, &claim); err != nil {
		if apierrors.IsNotFound(err) {
			return target{}, fmt.Errorf("ResourceClaim %s: %w", nn, ErrNotRecommended)
		}
		return target{}, fmt.Errorf("reading ResourceClaim %s: %w", nn, err)
	}
	podClaim := claim.Annotations[PodClaimNameAnnotation]
	owner := metav1.GetControllerOf(&claim)
	if podClaim == "" || owner == nil || owner.Kind != "Pod" {
		return target{}, fmt.Errorf("ResourceClaim %s: %w", nn, ErrNotRecommended)
	}
	request := ""
	if a := claim.Status.Allocation; a != nil {
		for _, res := range a.Devices.Results {
			if res.Driver == r.driver {
				request = res.Request
				break
			}
		}
	}
	if request == "" {
		// Not allocated as this reader sees it (yet): the request that asks memory is the sized one.
		for _, req := range claim.Spec.Devices.Requests {
			if req.Exactly != nil && req.Exactly.Capacity != nil {
				if _, ok := req.Exactly.Capacity.Requests["memory"]; ok {
					request = req.Name
					break
				}
			}
		}
	}
	if request == "" {
		return target{}, fmt.Errorf("ResourceClaim %s holds no sized request of %s: %w", nn, r.driver, ErrNotRecommended)
	}
	// A request of a list of alternatives is named <request>/<subrequest>; the sized request is the
	// parent.
	request, _, _ = strings.Cut(request, "/")
	w, err := r.top(ctx, nn.Namespace, "Pod", owner.Name)
	if err != nil {
		return target{}, err
	}
	return target{Namespace: nn.Namespace, Workload: w, PodClaim: podClaim, Request: request}, nil
}

// kinds maps an owner kind to its group and version, for the metadata reads.
var kinds = map[string]schema.GroupVersionKind{
	"Pod":         {Version: "v1", Kind: "Pod"},
	"ReplicaSet":  {Group: "apps", Version: "v1", Kind: "ReplicaSet"},
	"Deployment":  {Group: "apps", Version: "v1", Kind: "Deployment"},
	"StatefulSet": {Group: "apps", Version: "v1", Kind: "StatefulSet"},
	"DaemonSet":   {Group: "apps", Version: "v1", Kind: "DaemonSet"},
	"Job":         {Group: "batch", Version: "v1", Kind: "Job"},
	"CronJob":     {Group: "batch", Version: "v1", Kind: "CronJob"},
}

// top follows controller owners from kind/name up to a workload: ReplicaSet to Deployment, Job to
// CronJob; a StatefulSet, DaemonSet, or an object with no known controller is the top.
func (r *resolver) top(ctx context.Context, ns, kind, name string) (v1.WorkloadRef, error) {
	key := ns + "/" + kind + "/" + name
	if kind != "Pod" {
		r.mu.Lock()
		w, ok := r.owners[key]
		r.mu.Unlock()
		if ok {
			return w, nil
		}
	}
	self := v1.WorkloadRef{Kind: v1.WorkloadKind(kind), Name: name}
	switch kind {
	case "Pod", "ReplicaSet", "Job":
	default:
		return self, nil
	}
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(kinds[kind])
	if err := r.reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, m); err != nil {
		if apierrors.IsNotFound(err) {
			return self, fmt.Errorf("%s %s/%s: %w", kind, ns, name, ErrNotRecommended)
		}
		return self, fmt.Errorf("reading %s %s/%s: %w", kind, ns, name, err)
	}
	w := self
	if o := metav1.GetControllerOf(m); o != nil {
		if _, known := kinds[o.Kind]; known && o.Kind != "Pod" {
			var err error
			if w, err = r.top(ctx, ns, o.Kind, o.Name); err != nil {
				return w, err
			}
		}
	}
	if kind != "Pod" {
		r.mu.Lock()
		r.owners[key] = w
		r.mu.Unlock()
	}
	return w, nil
}
