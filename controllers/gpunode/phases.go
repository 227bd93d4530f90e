package gpunode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/index"
	"github.com/gpusharing/gpusharing/controllers/resolve"
)

// errNodeGone: the GPUNode's Node no longer exists, confirmed against the API server.
var errNodeGone = errors.New("node is gone")

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
		ok, err := r.admissible(ctx, c, s.gpuNode.Name, inFlight[name])
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		s.admitted[name] = true
		if !inFlight[name] {
			r.rollout.reserve(name, s.gpuNode.Name)
			reserved = append(reserved, name)
		}
	}
	s.reserved = reserved
	if len(reserved) > 0 {
		node := s.gpuNode.Name
		// Until writeSpec hands the reservations over to the cache, ending the pass drops them.
		s.release = func() { r.rollout.unreserve(node, reserved) }
	}
	return nil
}

// admissible applies the policy's budget to this node. It avoids work that grows with the cluster where
// it can, as admission runs once per node and change: a count needs no node count, and a percentage
// that covers every selected node admits without counting the nodes in flight.
func (r *Reconciler) admissible(ctx context.Context, c resolve.Compiled, node string, inFlight bool) (bool, error) {
	name := c.Policy.Name
	selected := 0
	if resolve.IsPercentage(c.Policy.Spec.Rollout) {
		n, err := r.selectedNodes(ctx, c)
		if err != nil {
			return false, err
		}
		selected = n
	}
	limit := resolve.MaxUnavailable(c.Policy.Spec.Rollout, selected)
	r.rollout.setLimit(name, limit)
	if inFlight || (selected > 0 && limit >= selected) {
		return true, nil
	}
	cached, err := r.inFlightNodes(ctx, name)
	if err != nil {
		return false, err
	}
	return resolve.Admit(false, r.rollout.othersInFlight(cached, name, node), limit), nil
}

// selectedNodes is countSelected remembered for a second per policy generation: a percentage budget
// needs the count, but not to the millisecond, and counting costs a pass over every node.
func (r *Reconciler) selectedNodes(ctx context.Context, c resolve.Compiled) (int, error) {
	if n, ok := r.rollout.selectedCount(c.Policy.Name, c.Policy.Generation); ok {
		return n, nil
	}
	n, err := r.countSelected(ctx, c)
	if err != nil {
		return 0, err
	}
	r.rollout.rememberSelected(c.Policy.Name, c.Policy.Generation, n)
	return n, nil
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

// countSelected counts the GPU nodes (Nodes with a GPUNode) the policy's nodeSelector selects: the base
// of a percentage maxUnavailable. Nodes without GPUs do not count, or a policy selecting every node of a
// mostly-CPU cluster would get a budget larger than its GPU nodes.
func (r *Reconciler) countSelected(ctx context.Context, c resolve.Compiled) (int, error) {
	if c.Err != nil {
		return 0, nil
	}
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NodeList"))
	if err := r.Client.List(ctx, list, client.MatchingLabelsSelector{Selector: c.Selector()}, unsafeNoCopy); err != nil {
		return 0, fmt.Errorf("listing Nodes selected by %s: %w", c.Policy.Name, err)
	}
	n := 0
	for i := range list.Items {
		var gn v1.GPUNode
		err := r.Client.Get(ctx, client.ObjectKey{Name: list.Items[i].Name}, &gn, unsafeNoCopy)
		switch {
		case err == nil:
			n++
		case !apierrors.IsNotFound(err):
			return 0, fmt.Errorf("getting GPUNode %s: %w", list.Items[i].Name, err)
		}
	}
	return n, nil
}

// patchSpec merge-patches the GPUNode's spec.gpus to gpus and returns the object's new generation. The
// list is atomic, so the patch replaces it whole, as a diff of the two objects would, without the copy and
// the two encodings a diff costs. The answer asked for is the object's metadata (the generation is all the
// resolver reads from it): the API server encodes, and this process decodes, a tenth of the GPUNode.
func (r *Reconciler) patchSpec(ctx context.Context, name string, gpus []v1.GPUDesired) (int64, error) {
	if len(gpus) == 0 {
		gpus = nil // null removes the list, as the diff of an emptied one did
	}
	body, err := json.Marshal(map[string]any{"spec": map[string]any{"gpus": gpus}})
	if err != nil {
		return 0, err
	}
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(v1.GroupVersion.WithKind("GPUNode"))
	m.Name = name
	if err := r.Client.Patch(ctx, m, client.RawPatch(types.MergePatchType, body)); err != nil {
		return 0, err
	}
	return m.Generation, nil
}

// writeSpec patches the GPUNode's spec when it changed. The controller is the only writer of spec, and a
// merge patch replaces the whole list, so no optimistic lock is needed against the agent's status writes.
func (r *Reconciler) writeSpec(ctx context.Context, s *scope) error {
	s.spec, s.waiting = resolve.Build(s.wishes, s.admitted)
	gn := s.gpuNode
	if len(gn.Spec.GPUs) == 0 && len(s.spec) == 0 || equality.Semantic.DeepEqual(gn.Spec.GPUs, s.spec) {
		return nil
	}
	// Before the write: its event can reach the informer before its answer reaches this worker.
	r.echoes.writing(gn.Name, s.spec)
	generation, err := r.patchSpec(ctx, gn.Name, s.spec)
	if err != nil {
		return fmt.Errorf("writing GPUNode spec: %w", err)
	}
	gn.Spec.GPUs, gn.Generation = s.spec, generation
	logf.FromContext(ctx).V(1).Info("Wrote GPUNode spec", "gpus", len(s.spec), "generation", gn.Generation, "admitted", s.reserved)
	if len(s.reserved) > 0 {
		// The reservations now last until the cache shows this generation (see rollout.written); the
		// worker does not wait for that.
		r.rollout.written(gn.Name, s.reserved, gn.Generation)
		s.release = func() {}
		var cached v1.GPUNode
		if err := r.Client.Get(ctx, client.ObjectKey{Name: gn.Name}, &cached, unsafeNoCopy); err == nil {
			r.rollout.observed(gn.Name, cached.Generation)
		}
	}
	return nil
}
