package vacate

import (
	"context"
	"errors"
	"fmt"
	"time"

	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// evictTimeout bounds one eviction call.
const evictTimeout = 10 * time.Second

// Evictor asks the API server to evict a pod through the Eviction API (pods/eviction), which honours
// PodDisruptionBudgets. A non-empty uid is a precondition: a pod of the same name but another uid (one
// recreated since Vacate read it, possibly on another node) is not evicted; the API server answers
// 409 Conflict.
type Evictor interface {
	Evict(ctx context.Context, pod PodRef, uid types.UID) error
}

// NewEvictor returns an Evictor over cfg. It turns off client-go's retries: a 429 with Retry-After (what a
// budget the disruption controller has not yet observed answers) would otherwise hold the call for up to
// ten retries of ten seconds, hiding the budget from the progress and overrunning its timeout.
func NewEvictor(cfg *rest.Config) (Evictor, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("building an eviction client: %w", err)
	}
	return &restEvictor{c: cs.PolicyV1().RESTClient()}, nil
}

type restEvictor struct{ c rest.Interface }

func (e *restEvictor) Evict(ctx context.Context, pod PodRef, uid types.UID) error {
	ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name}}
	if uid != "" {
		ev.DeleteOptions = &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}
	}
	return e.c.Post().AbsPath("/api/v1").Namespace(pod.Namespace).Resource("pods").Name(pod.Name).
		SubResource("eviction").MaxRetries(0).Body(ev).Do(ctx).Error()
}

// evictAll asks the API server to evict every pod not yet evicted. A PodDisruptionBudget that does not
// allow the disruption now answers 429: the pod is reported blocked and tried again on the next poll.
// Any other refusal ends Vacate with ErrEvictionFailed.
func (r *run) evictAll(ctx context.Context, pods []PodRef, deadline time.Time) error {
	for _, p := range pods {
		if r.evicted[p] {
			continue
		}
		who, known := r.pods[p]
		if known && who.elsewhere {
			// The API server binds a pod of this name to another node: the kubelet's entry is a stale one
			// of a pod that was recreated there. That pod is not this GPU's to evict; the kubelet drops
			// the entry once the old containers are gone.
			msg := fmt.Sprintf("the API server binds %s to node %s, not %s: not evicted, waiting for the kubelet to drop it", p, who.node, r.v.NodeName)
			if r.blockedMsg[p] != msg {
				r.step(ctx, StepEvictionBlocked, []PodRef{p}, "%s", msg)
			}
			r.blockedMsg[p] = msg
			continue
		}
		if known && who.terminating {
			// Already on its way out (evicted by an earlier Vacate of this drain, by an agent killed mid-drain, or
			// deleted by someone): wait for it to end rather than disrupt it a second time.
			r.evicted[p] = true
			r.step(ctx, StepEvicted, []PodRef{p}, "pod %s is already terminating; waiting for it to end", p)
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, max(time.Second, min(evictTimeout, deadline.Sub(r.now()))))
		err := r.v.Evictor.Evict(cctx, p, who.uid)
		callTimedOut := errors.Is(cctx.Err(), context.DeadlineExceeded)
		cancel()
		switch {
		case err == nil:
			r.evicted[p] = true
			delete(r.blockedMsg, p)
			r.res.Evicted = append(r.res.Evicted, p)
			r.step(ctx, StepEvicted, []PodRef{p}, "evicted pod %s from GPU %s", p, r.req.GPUUUID)
		case apierrors.IsNotFound(err):
			// Already gone from the API server; the kubelet will drop it.
			r.evicted[p] = true
		case apierrors.IsConflict(err):
			// The uid precondition failed: the pod was recreated since it was read. The next poll reads
			// it again and evicts it only if it is still this node's and still on the GPU.
			delete(r.pods, p)
		case apierrors.IsTooManyRequests(err):
			msg := describe(err)
			if r.blockedMsg[p] != msg {
				r.step(ctx, StepEvictionBlocked, []PodRef{p}, "eviction of %s blocked, retrying: %s", p, msg)
			}
			r.blockedMsg[p] = msg
		case callTimedOut && ctx.Err() == nil:
			// This call ran out of time but Vacate has not: try again on the next poll.
			msg := fmt.Sprintf("no answer within the call's timeout: %v", err)
			if r.blockedMsg[p] != msg {
				r.step(ctx, StepEvictionBlocked, []PodRef{p}, "eviction of %s pending, retrying: %s", p, msg)
			}
			r.blockedMsg[p] = msg
		default:
			return fmt.Errorf("%w: pod %s on GPU %s: %w", ErrEvictionFailed, p, r.req.GPUUUID, err)
		}
	}
	return nil
}

// describe is the API error's message with its causes, which name the budget and why it refuses.
func describe(err error) string {
	msg := err.Error()
	var st apierrors.APIStatus
	if errors.As(err, &st) && st.Status().Details != nil {
		for _, c := range st.Status().Details.Causes {
			msg += " " + c.Message
		}
	}
	return msg
}
