package guard

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/gpusharing/gpusharing/agent/vacate"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// evictRetry spaces the evictions of one pod that did not end it (a PodDisruptionBudget that allows none
// now, an API server away).
const evictRetry = 10 * time.Second

// Enforcer warns about the pods the verdicts name, once per pod and GPU, and evicts them where the GPU's
// action is Evict. The pods are those podpid named on this node (their cgroups are this node's), and
// each eviction carries the pod's UID as precondition.
type Enforcer struct {
	NodeName string
	// Recorder emits the warning events on the pods; nil emits none.
	Recorder events.EventRecorder
	// Evictor evicts; nil only reports.
	Evictor vacate.Evictor
	// Clock spaces retried evictions; nil means the real clock.
	Clock clock.PassiveClock

	mu sync.Mutex
	// warned and evicted are keyed by GPU and pod UID; an entry leaves with the pod's last unmanaged
	// process on the GPU.
	warned  map[podOnGPU]bool
	evicted map[podOnGPU]time.Time
}

type podOnGPU struct {
	gpu string
	uid types.UID
	pod vacate.PodRef
}

// GPU is what the enforcer needs of a checked GPU.
type GPU struct {
	UUID    string
	Index   int32
	Action  v1alpha1.UnmanagedAction
	Verdict Verdict
}

// Enforce acts on one pass's verdicts. Events and evictions go out after the lock is released: the
// API server may be slow or away, and the next pass must not wait on it.
func (e *Enforcer) Enforce(ctx context.Context, gpus []GPU) {
	log := ctrl.LoggerFrom(ctx)
	type act struct {
		key  podOnGPU
		gpu  GPU
		p    Process
		warn bool
	}
	var acts []act
	e.mu.Lock()
	if e.warned == nil {
		e.warned, e.evicted = map[podOnGPU]bool{}, map[podOnGPU]time.Time{}
	}
	now := e.now()
	still := map[podOnGPU]bool{}
	for _, g := range gpus {
		for _, p := range g.Verdict.Named {
			key := podOnGPU{gpu: g.UUID, uid: p.UID, pod: p.PodRef}
			if still[key] {
				continue // the pod's other processes: one event, one eviction
			}
			still[key] = true
			a := act{key: key, gpu: g, p: p, warn: !e.warned[key]}
			e.warned[key] = true
			if g.Action == v1alpha1.UnmanagedEvict && e.Evictor != nil {
				if last, ok := e.evicted[key]; !ok || now.Sub(last) >= evictRetry {
					e.evicted[key] = now
				} else if !a.warn {
					continue
				}
			} else if !a.warn {
				continue
			}
			acts = append(acts, a)
		}
	}
	for _, g := range gpus {
		if !g.Verdict.Read {
			// Not read this time: what it named stands.
			for key := range e.warned {
				if key.gpu == g.UUID {
					still[key] = true
				}
			}
		}
	}
	for key := range e.warned {
		if !still[key] {
			delete(e.warned, key)
			delete(e.evicted, key)
		}
	}
	evictAt := map[podOnGPU]time.Time{}
	for k, v := range e.evicted {
		evictAt[k] = v
	}
	e.mu.Unlock()

	for _, a := range acts {
		if a.warn {
			log.Info("Unmanaged process on a shared GPU", "pod", a.p.PodRef, "container", a.p.Container, "pid", a.p.PID, "gpu", a.gpu.UUID)
			if e.Recorder != nil {
				pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: a.p.Namespace, Name: a.p.Name, UID: a.p.UID}}
				e.Recorder.Eventf(pod, nil, corev1.EventTypeWarning, v1alpha1.ReasonUnmanagedProcesses, "Check",
					"GPU %d (%s) on %s: %s holds a context without being a client of what shares the GPU", a.gpu.Index, a.gpu.UUID, e.NodeName, a.p.describe(true))
			}
		}
		if a.gpu.Action != v1alpha1.UnmanagedEvict || e.Evictor == nil || !evictAt[a.key].Equal(now) {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, evictRetry)
		err := e.Evictor.Evict(cctx, a.p.PodRef, a.p.UID)
		cancel()
		switch {
		case err == nil:
			log.Info("Evicted a pod with an unmanaged process", "pod", a.p.PodRef, "gpu", a.gpu.UUID)
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
			// Gone already, or a pod of the same name with another uid: not the one named.
		default:
			log.Info("Cannot evict a pod with an unmanaged process yet", "pod", a.p.PodRef, "error", err.Error())
		}
	}
}

func (e *Enforcer) now() time.Time {
	if e.Clock == nil {
		return time.Now()
	}
	return e.Clock.Now()
}
