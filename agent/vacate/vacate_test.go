package vacate

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/fakekubelet"
	"github.com/gpusharing/gpusharing/test/wait"
)

const pollInterval = 50 * time.Millisecond

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// startPodResources serves a fake PodResources API on a short socket path and returns a client for it.
func startPodResources(t *testing.T) (*fakekubelet.PodResources, PodResourcesLister) {
	t.Helper()
	dir, err := os.MkdirTemp("", "pr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	srv, err := fakekubelet.StartPodResources(filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	c, closeFn, err := DialPodResources(srv.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closeFn() })
	return srv, c
}

func namespace(t *testing.T, ctx context.Context) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "vacate-"}}
	if err := env.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// progress collects steps and lets the test wait for one.
type progress struct {
	mu    sync.Mutex
	steps []Step
	ch    chan Step
}

func newProgress() *progress { return &progress{ch: make(chan Step, 256)} }

func (p *progress) report(s Step) {
	p.mu.Lock()
	p.steps = append(p.steps, s)
	p.mu.Unlock()
	p.ch <- s
}

func (p *progress) waitFor(t *testing.T, ctx context.Context, kind StepKind) Step {
	t.Helper()
	for {
		select {
		case s := <-p.ch:
			if s.Kind == kind {
				return s
			}
		case <-ctx.Done():
			t.Fatalf("no %s step: %v", kind, ctx.Err())
		}
	}
}

func kinds(steps []Step) []StepKind {
	out := make([]StepKind, len(steps))
	for i, s := range steps {
		out[i] = s.Kind
	}
	return out
}

func evictor(t *testing.T, cfg *rest.Config) Evictor {
	t.Helper()
	e, err := NewEvictor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

type outcome struct {
	res Result
	err error
}

func vacateAsync(ctx context.Context, d *Vacater, req Request) chan outcome {
	ch := make(chan outcome, 1)
	go func() {
		res, err := d.Vacate(ctx, req)
		ch <- outcome{res, err}
	}()
	return ch
}

func TestWaitForIdleCompletesWhenThePodsEnd(t *testing.T) {
	ctx := testCtx(t)
	ns := namespace(t, ctx)
	pr, lister := startPodResources(t)
	replica := env.RunningPod(t, ctx, ns, "replica", nil)
	env.RunningPod(t, ctx, ns, "mig", nil)
	env.RunningPod(t, ctx, ns, "other-gpu", nil)
	pr.SetPods(
		fakekubelet.Pod(ns, "replica", "gpusharing.io/gpu-timeslice", "GPU-a::1"),
		fakekubelet.Pod(ns, "mig", "nvidia.com/mig-1g.10gb", "MIG-a1"),
		fakekubelet.Pod(ns, "other-gpu", "nvidia.com/gpu", "GPU-b"),
	)
	p := newProgress()
	d := &Vacater{PodResources: lister, Pods: env.Client, Evictor: evictor(t, env.Config), PollInterval: pollInterval}
	done := vacateAsync(ctx, d, Request{GPUUUID: "GPU-a", MIGUUIDs: []string{"MIG-a1"}, Mode: v1alpha1.DrainWaitForIdle, Timeout: 20 * time.Second, Progress: p.report})

	want := []PodRef{{ns, "mig"}, {ns, "replica"}}
	if s := p.waitFor(t, ctx, StepWaiting); !reflect.DeepEqual(s.Pods, want) {
		t.Errorf("waiting for %v, want %v (the other GPU's pod is not this GPU's business)", s.Pods, want)
	}
	// One pod finishes (the API server says Succeeded while the kubelet still lists it), the other's
	// containers go away.
	env.SetPodPhase(t, ctx, replica, corev1.PodSucceeded)
	pr.RemovePod(ns, "mig")

	o := <-done
	if o.err != nil {
		t.Fatalf("Vacate: %v", o.err)
	}
	if !reflect.DeepEqual(o.res.Found, want) || len(o.res.Remaining) != 0 || len(o.res.Evicted) != 0 {
		t.Errorf("result: found %v remaining %v evicted %v; want found %v, nothing remaining or evicted", o.res.Found, o.res.Remaining, o.res.Evicted, want)
	}
	got := kinds(o.res.Steps)
	if got[0] != StepListed || got[len(got)-1] != StepVacated {
		t.Errorf("steps %v: want Listed first and Idle last", got)
	}
	if len(p.steps) != len(o.res.Steps) {
		t.Errorf("progress saw %d steps, result has %d", len(p.steps), len(o.res.Steps))
	}
	// Vacate never evicts in WaitForIdle.
	var pod corev1.Pod
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "other-gpu"}, &pod); err != nil {
		t.Errorf("other GPU's pod: %v", err)
	}
}

func TestEvictWaitsWhileAPodDisruptionBudgetBlocksAndCompletesWhenItAllows(t *testing.T) {
	ctx := testCtx(t)
	ns := namespace(t, ctx)
	pr, lister := startPodResources(t)
	labels := map[string]string{"app": "inference"}
	env.RunningPod(t, ctx, ns, "server", labels)
	pr.SetPods(fakekubelet.Pod(ns, "server", "gpusharing.io/gpu-mps", "GPU-a::0"))
	pdb := env.BlockingPDB(t, ctx, ns, labels)

	p := newProgress()
	d := &Vacater{PodResources: lister, Pods: env.Client, Evictor: evictor(t, env.Config), PollInterval: pollInterval}
	done := vacateAsync(ctx, d, Request{GPUUUID: "GPU-a", Mode: v1alpha1.DrainEvict, Timeout: 20 * time.Second, Progress: p.report})

	blocked := p.waitFor(t, ctx, StepEvictionBlocked)
	if !reflect.DeepEqual(blocked.Pods, []PodRef{{ns, "server"}}) || !strings.Contains(blocked.Message, "disruption budget") {
		t.Errorf("blocked step: pods %v message %q; want the pod and the budget named", blocked.Pods, blocked.Message)
	}
	// Several polls later (each lists the kubelet's pods, then tries the eviction again) the pod is still
	// there: the budget holds.
	listed := pr.Lists()
	wait.Until(t, 30*time.Second, func() bool { return pr.Lists() >= listed+3 }, "three more polls")
	var pod corev1.Pod
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "server"}, &pod); err != nil || pod.DeletionTimestamp != nil {
		t.Fatalf("pod while the budget blocks: %v, deleting=%v; want it untouched", err, pod.DeletionTimestamp != nil)
	}
	env.SetPDBAllowed(t, ctx, pdb, 1)

	o := <-done
	if o.err != nil {
		t.Fatalf("Vacate: %v", o.err)
	}
	if !reflect.DeepEqual(o.res.Evicted, []PodRef{{ns, "server"}}) || len(o.res.Remaining) != 0 {
		t.Errorf("evicted %v remaining %v; want the pod evicted and nothing remaining", o.res.Evicted, o.res.Remaining)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "server"}, &pod); !apierrors.IsNotFound(err) {
		t.Errorf("pod after eviction: %v, want NotFound", err)
	}
	got := kinds(o.res.Steps)
	if idx(got, StepEvictionBlocked) > idx(got, StepEvicted) || idx(got, StepEvicted) < 0 || got[len(got)-1] != StepVacated {
		t.Errorf("steps %v: want EvictionBlocked, then Evicted, then Idle", got)
	}
}

func idx(ps []StepKind, p StepKind) int {
	for i, x := range ps {
		if x == p {
			return i
		}
	}
	return -1
}

// blockingPDB creates a budget for the labels and writes the status a disruption controller would (no
// controller runs in envtest): observed, nothing may be disrupted.

func TestTimeoutReturnsErrTimeoutNamingTheRemainingPods(t *testing.T) {
	for _, tc := range []struct {
		name        string
		mode        v1alpha1.DrainMode
		wantMessage string
	}{
		{"WaitForIdle with a pod that never ends", v1alpha1.DrainWaitForIdle, "still use GPU GPU-a"},
		{"Evict with a budget that never allows", v1alpha1.DrainEvict, "PodDisruptionBudget"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			ns := namespace(t, ctx)
			pr, lister := startPodResources(t)
			labels := map[string]string{"app": "stuck"}
			env.RunningPod(t, ctx, ns, "stuck", labels)
			pr.SetPods(fakekubelet.Pod(ns, "stuck", "nvidia.com/gpu", "GPU-a"))
			env.BlockingPDB(t, ctx, ns, labels)
			p := newProgress()
			d := &Vacater{PodResources: lister, Pods: env.Client, Evictor: evictor(t, env.Config), PollInterval: pollInterval}
			res, err := d.Vacate(ctx, Request{GPUUUID: "GPU-a", Mode: tc.mode, Timeout: 400 * time.Millisecond, Progress: p.report})
			if !errors.Is(err, ErrTimeout) {
				t.Fatalf("got %v, want ErrTimeout", err)
			}
			if !strings.Contains(err.Error(), ns+"/stuck") || !strings.Contains(err.Error(), tc.wantMessage) {
				t.Errorf("error %q: want it to name %s/stuck and say %q", err, ns, tc.wantMessage)
			}
			if !reflect.DeepEqual(res.Remaining, []PodRef{{ns, "stuck"}}) {
				t.Errorf("remaining %v, want the stuck pod", res.Remaining)
			}
			if last := res.Steps[len(res.Steps)-1]; last.Kind != StepTimedOut || p.steps[len(p.steps)-1].Kind != StepTimedOut {
				t.Errorf("last step %v, want TimedOut reported to progress too", last)
			}
			if res.Duration < 400*time.Millisecond {
				t.Errorf("gave up after %v, before the 400ms timeout", res.Duration)
			}
		})
	}
}

func TestEvictionRefusedForAnotherReasonFailsAtOnce(t *testing.T) {
	ctx := testCtx(t)
	ns := namespace(t, ctx)
	pr, lister := startPodResources(t)
	env.RunningPod(t, ctx, ns, "job", nil)
	pr.SetPods(fakekubelet.Pod(ns, "job", "nvidia.com/gpu", "GPU-a"))
	// A user without RBAC for pods/eviction.
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:gpusharing:no-rights"}
	d := &Vacater{PodResources: lister, Pods: env.Client, Evictor: evictor(t, cfg), PollInterval: pollInterval}
	res, err := d.Vacate(ctx, Request{GPUUUID: "GPU-a", Mode: v1alpha1.DrainEvict, Timeout: 20 * time.Second})
	if !errors.Is(err, ErrEvictionFailed) || !apierrors.IsForbidden(err) {
		t.Fatalf("got %v, want ErrEvictionFailed carrying the Forbidden answer", err)
	}
	if res.Duration > 10*time.Second || !reflect.DeepEqual(res.Remaining, []PodRef{{ns, "job"}}) {
		t.Errorf("duration %v remaining %v: want an immediate failure naming the pod", res.Duration, res.Remaining)
	}
}

func TestUnreachablePodResourcesTimesOutWithBothErrors(t *testing.T) {
	ctx := testCtx(t)
	c, closeFn, err := DialPodResources("/nonexistent/pod-resources/kubelet.sock")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = closeFn() }()
	d := &Vacater{PodResources: c, PollInterval: pollInterval}
	res, err := d.Vacate(ctx, Request{GPUUUID: "GPU-a", Timeout: 200 * time.Millisecond})
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, ErrPodResourcesUnavailable) {
		t.Fatalf("got %v, want ErrTimeout and ErrPodResourcesUnavailable", err)
	}
	if idx(kinds(res.Steps), StepListFailed) < 0 {
		t.Errorf("steps %v: want the list failure reported", kinds(res.Steps))
	}
}

func TestInvalidRequestsAreRefused(t *testing.T) {
	_, lister := startPodResources(t)
	for _, tc := range []struct {
		name string
		d    *Vacater
		req  Request
	}{
		{"no GPU uuid", &Vacater{PodResources: lister}, Request{Timeout: time.Second}},
		{"unknown mode", &Vacater{PodResources: lister}, Request{GPUUUID: "GPU-a", Mode: "Delete"}},
		{"Evict without an Evictor", &Vacater{PodResources: lister}, Request{GPUUUID: "GPU-a", Mode: v1alpha1.DrainEvict}},
		{"neither PodResources nor claims", &Vacater{}, Request{GPUUUID: "GPU-a"}},
		{"no PodResources client", &Vacater{}, Request{GPUUUID: "GPU-a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := tc.d.Vacate(context.Background(), tc.req); !errors.Is(err, ErrInvalidRequest) {
				t.Errorf("got %v, want ErrInvalidRequest", err)
			}
		})
	}
}

func TestABudgetNotYetObservedIsReportedBlockedAtOnceAndCancelStopsVacate(t *testing.T) {
	ctx := testCtx(t)
	ns := namespace(t, ctx)
	pr, lister := startPodResources(t)
	labels := map[string]string{"app": "fresh"}
	env.RunningPod(t, ctx, ns, "server", labels)
	pr.SetPods(fakekubelet.Pod(ns, "server", "nvidia.com/gpu", "GPU-a"))
	// No status: the API server answers 429 with Retry-After until a disruption controller observes it,
	// which client-go would silently retry for up to 100s.
	one := intstr.FromInt32(1)
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fresh"},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: &one, Selector: &metav1.LabelSelector{MatchLabels: labels}},
	}
	if err := env.Client.Create(ctx, pdb); err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithCancel(ctx)
	p := newProgress()
	d := &Vacater{PodResources: lister, Pods: env.Client, Evictor: evictor(t, env.Config), PollInterval: pollInterval}
	start := time.Now()
	done := vacateAsync(dctx, d, Request{GPUUUID: "GPU-a", Mode: v1alpha1.DrainEvict, Timeout: 20 * time.Second, Progress: p.report})
	s := p.waitFor(t, ctx, StepEvictionBlocked)
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("blocked step after %v; want it at the first attempt, not after client retries", took)
	}
	if !strings.Contains(s.Message, "fresh") {
		t.Errorf("blocked message %q does not name the budget", s.Message)
	}
	cancel()
	o := <-done
	if !errors.Is(o.err, context.Canceled) || !reflect.DeepEqual(o.res.Remaining, []PodRef{{ns, "server"}}) {
		t.Errorf("after cancel: %v, remaining %v; want context.Canceled and the pod remaining", o.err, o.res.Remaining)
	}
}

// A pod the kubelet still lists on this GPU but the API server binds to another node (deleted here and
// recreated there under the same name) is never evicted: it is not this node's.
func TestEvictNeverEvictsASameNamedPodBoundToAnotherNode(t *testing.T) {
	ctx := testCtx(t)
	ns := namespace(t, ctx)
	pr, lister := startPodResources(t)
	moved := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "moved"},
		Spec: corev1.PodSpec{NodeName: "other-node", Containers: []corev1.Container{{Name: "main", Image: "example.com/cuda:1"}}}}
	if err := env.Client.Create(ctx, moved); err != nil {
		t.Fatal(err)
	}
	env.SetPodPhase(t, ctx, moved, corev1.PodRunning)
	pr.SetPods(fakekubelet.Pod(ns, "moved", "nvidia.com/gpu", "GPU-a"))
	d := &Vacater{PodResources: lister, Pods: env.Client, Evictor: evictor(t, env.Config), NodeName: "this-node", PollInterval: pollInterval}
	res, err := d.Vacate(ctx, Request{GPUUUID: "GPU-a", Mode: v1alpha1.DrainEvict, Timeout: time.Second})
	if !errors.Is(err, ErrTimeout) || len(res.Evicted) != 0 {
		t.Fatalf("Vacate = %v, evicted %v; want a timeout and no eviction", err, res.Evicted)
	}
	var pod corev1.Pod
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(moved), &pod); err != nil || pod.DeletionTimestamp != nil {
		t.Errorf("the other node's pod: %v, deleting %v; want it untouched", err, pod.DeletionTimestamp)
	}
	blocked := false
	for _, s := range res.Steps {
		blocked = blocked || (s.Kind == StepEvictionBlocked && strings.Contains(s.Message, "other-node"))
	}
	if !blocked {
		t.Errorf("steps %v: want an EvictionBlocked step naming the other node", kinds(res.Steps))
	}
}

// An eviction names the uid Vacate read: a pod recreated under the same name since is not evicted.
func TestEvictionCarriesThePodsUIDAsAPrecondition(t *testing.T) {
	ctx := testCtx(t)
	ns := namespace(t, ctx)
	pod := env.RunningPod(t, ctx, ns, "worker", nil)
	e := evictor(t, env.Config)
	err := e.Evict(ctx, PodRef{ns, "worker"}, types.UID("0b4d4c4e-0000-4000-8000-000000000000"))
	if !apierrors.IsConflict(err) {
		t.Fatalf("eviction with another pod's uid = %v, want 409 Conflict", err)
	}
	var got corev1.Pod
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pod), &got); err != nil || got.DeletionTimestamp != nil {
		t.Fatalf("after the refused eviction: %v, deleting %v; want the pod untouched", err, got.DeletionTimestamp)
	}
	if err := e.Evict(ctx, PodRef{ns, "worker"}, pod.UID); err != nil {
		t.Fatalf("eviction with the pod's own uid: %v", err)
	}
}

// countingEvictor counts the evictions asked of the API server.
type countingEvictor struct {
	Evictor
	calls int
}

func (c *countingEvictor) Evict(ctx context.Context, pod PodRef, uid types.UID) error {
	c.calls++
	return c.Evictor.Evict(ctx, pod, uid)
}

// A pod already terminating (evicted by an agent killed mid-drain, the drain resumed by the next one) is
// waited for, not evicted a second time.
func TestATerminatingPodIsWaitedForNotEvictedAgain(t *testing.T) {
	ctx := testCtx(t)
	ns := namespace(t, ctx)
	pr, lister := startPodResources(t)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "leaving"},
		Spec: corev1.PodSpec{NodeName: "this-node", Containers: []corev1.Container{{Name: "main", Image: "example.com/cuda:1"}}}}
	if err := env.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	env.SetPodPhase(t, ctx, pod, corev1.PodRunning)
	// Bound to a node, the pod stays (terminating) until its kubelet confirms; envtest has none.
	if err := env.Client.Delete(ctx, pod); err != nil {
		t.Fatal(err)
	}
	pr.SetPods(fakekubelet.Pod(ns, "leaving", "nvidia.com/gpu", "GPU-a"))
	ev := &countingEvictor{Evictor: evictor(t, env.Config)}
	d := &Vacater{PodResources: lister, Pods: env.Client, Evictor: ev, NodeName: "this-node", PollInterval: pollInterval}
	res, err := d.Vacate(ctx, Request{GPUUUID: "GPU-a", Mode: v1alpha1.DrainEvict, Timeout: time.Second})
	if !errors.Is(err, ErrTimeout) || len(res.Remaining) != 1 {
		t.Fatalf("Vacate = %v, remaining %v; want a timeout waiting for the terminating pod", err, res.Remaining)
	}
	if ev.calls != 0 || len(res.Evicted) != 0 {
		t.Errorf("%d evictions asked (evicted %v), want none: the pod was already terminating", ev.calls, res.Evicted)
	}
}
