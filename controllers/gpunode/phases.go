package gpunode

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/index"
	"github.com/gpusharing/gpusharing/controllers/resolve"
)

var (
	// errNodeGone: the GPUNode's Node no longer exists, confirmed against the API server.
	errNodeGone = errors.New("node is gone")
	// errCacheLagging: the cache did not show our own spec write in time; the pass is retried so the next
	// admission decision counts this node.
	errCacheLagging = errors.New("cache did not observe the spec write in time")
)

// cacheWaitTimeout bounds how long an admitting pass waits for its write to reach the cache.
const cacheWaitTimeout = 10 * time.Second

// unsafeNoCopy reads straight from the cache; results are only read, never mutated.
var unsafeNoCopy = client.UnsafeDisableDeepCopy

func nodeMeta() *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
	return m
}

// loadNode reads the Node's labels (metadata only: the resolver never needs a Node's status, and
// caching only metadata keeps memory flat on large clusters).
func (r *Reconciler) loadNode(ctx context.Context, s *scope) error {
	key := client.ObjectKey{Name: s.gpuNode.Name}
	node := nodeMeta()
	err := r.Client.Get(ctx, key, node)
	if apierrors.IsNotFound(err) {
		// The cache may simply not have seen a new Node yet; only the API server can say it is gone.
		err = r.APIReader.Get(ctx, key, node)
		if apierrors.IsNotFound(err) {
			return errNodeGone
		}
	}
	if err != nil {
		return fmt.Errorf("getting Node %s: %w", key.Name, err)
	}
	s.labels = node.Labels
	return nil
}

// deleteOrphan deletes a GPUNode whose Node is gone. Garbage collection is not relied on: whether the
// agent sets an owner reference to the Node is the agent's business, and envtest runs no collector.
func (r *Reconciler) deleteOrphan(ctx context.Context, gn *v1.GPUNode) error {
	logf.FromContext(ctx).Info("Deleting GPUNode whose Node is gone")
	err := r.Client.Delete(ctx, gn, client.Preconditions{UID: &gn.UID})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting GPUNode of a deleted Node: %w", err)
	}
	return nil
}

func (r *Reconciler) loadPolicies(ctx context.Context, s *scope) error {
	var list v1.GPUSharingPolicyList
	if err := r.Client.List(ctx, &list, unsafeNoCopy); err != nil {
		return fmt.Errorf("listing GPUSharingPolicies: %w", err)
	}
	ps := make([]*v1.GPUSharingPolicy, len(list.Items))
	for i := range list.Items {
		ps[i] = &list.Items[i]
	}
	s.policies = resolve.Compile(ps)
	s.byName = make(map[string]resolve.Compiled, len(s.policies))
	for _, c := range s.policies {
		s.byName[c.Policy.Name] = c
	}
	return nil
}

func (r *Reconciler) plan(_ context.Context, s *scope) error {
	res := resolve.ResolveNode(s.policies, s.labels, s.gpuNode.Status.GPUs)
	s.wishes = resolve.Wishes(res, s.gpuNode)
	return nil
}

// admit decides, per policy with a disruptive change pending here, whether this node may start it. The
// count of nodes in flight comes from the cache index, so it is rebuilt from the objects after a restart;
// a node admitted by a pass whose write the cache does not show yet holds a reservation meanwhile, so
// decisions are serialized but the writes are not.
func (r *Reconciler) admit(ctx context.Context, s *scope) error {
	s.admitted = map[string]bool{}
	need := resolve.NeedsAdmission(s.wishes)
	if len(need) == 0 {
		return nil
	}
	inFlight := map[string]bool{}
	for _, p := range resolve.InFlightPolicies(s.gpuNode) {
		inFlight[p] = true
	}
	r.rollout.admission.Lock()
	defer r.rollout.admission.Unlock()
	var reserved []string
	for _, name := range need {
		c := s.byName[name]
		cached, err := r.inFlightNodes(ctx, name)
		if err != nil {
			return err
		}
		selected, err := r.countSelected(ctx, c)
		if err != nil {
			return err
		}
		limit := resolve.MaxUnavailable(c.Policy.Spec.Rollout, selected)
		r.rollout.setLimit(name, limit)
		if !resolve.Admit(inFlight[name], r.rollout.othersInFlight(cached, name, s.gpuNode.Name), limit) {
			continue
		}
		s.admitted[name] = true
		if !inFlight[name] {
			r.rollout.reserve(name, s.gpuNode.Name)
			reserved = append(reserved, name)
		}
	}
	if len(reserved) > 0 {
		s.startsRollout = true
		node := s.gpuNode.Name
		s.release = func() { r.rollout.unreserve(node, reserved) }
	}
	return nil
}

func (r *Reconciler) inFlightNodes(ctx context.Context, policy string) ([]string, error) {
	var list v1.GPUNodeList
	if err := r.Client.List(ctx, &list, client.MatchingFields{index.InFlightPolicy: policy}, unsafeNoCopy); err != nil {
		return nil, fmt.Errorf("listing GPUNodes in flight for %s: %w", policy, err)
	}
	names := make([]string, len(list.Items))
	for i := range list.Items {
		names[i] = list.Items[i].Name
	}
	return names, nil
}

// countSelected counts the Nodes the policy's nodeSelector selects: the base of a percentage maxUnavailable.
func (r *Reconciler) countSelected(ctx context.Context, c resolve.Compiled) (int, error) {
	if c.Err != nil {
		return 0, nil
	}
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NodeList"))
	if err := r.Client.List(ctx, list, client.MatchingLabelsSelector{Selector: c.Selector()}, unsafeNoCopy); err != nil {
		return 0, fmt.Errorf("listing Nodes selected by %s: %w", c.Policy.Name, err)
	}
	return len(list.Items), nil
}

// writeSpec patches the GPUNode's spec when it changed. The controller is the only writer of spec, and a
// merge patch replaces the whole list, so no optimistic lock is needed against the agent's status writes.
func (r *Reconciler) writeSpec(ctx context.Context, s *scope) error {
	s.spec, s.waiting = resolve.Build(s.wishes, s.admitted)
	gn := s.gpuNode
	if len(gn.Spec.GPUs) == 0 && len(s.spec) == 0 || equality.Semantic.DeepEqual(gn.Spec.GPUs, s.spec) {
		return nil
	}
	patch := client.MergeFrom(gn.DeepCopy())
	gn.Spec.GPUs = s.spec
	if err := r.Client.Patch(ctx, gn, patch); err != nil {
		return fmt.Errorf("writing GPUNode spec: %w", err)
	}
	logf.FromContext(ctx).V(1).Info("Wrote GPUNode spec", "gpus", len(s.spec), "generation", gn.Generation, "startsRollout", s.startsRollout)
	if s.startsRollout {
		return r.waitForCache(ctx, gn.Name, gn.Generation)
	}
	return nil
}

// waitForCache polls the cache until it holds the GPUNode at generation or later.
func (r *Reconciler) waitForCache(ctx context.Context, name string, generation int64) error {
	err := wait.PollUntilContextTimeout(ctx, 2*time.Millisecond, cacheWaitTimeout, true, func(ctx context.Context) (bool, error) {
		var cached v1.GPUNode
		if err := r.Client.Get(ctx, client.ObjectKey{Name: name}, &cached, unsafeNoCopy); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return cached.Generation >= generation, nil
	})
	if err != nil {
		return fmt.Errorf("%w: GPUNode %s generation %d: %w", errCacheLagging, name, generation, err)
	}
	return nil
}
