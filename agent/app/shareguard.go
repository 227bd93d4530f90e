package app

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/gpusharing/gpusharing/agent/deviceplugin"
	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/podpid"
)

// ReasonNoGPUShare is the reason of the warning event on a pod whose process was refused a GPU's shim
// scheduler because the pod holds no share of that GPU. What to do: give the pod a share of that GPU (a
// device plugin resource or a ResourceClaim of it) instead of mounting another GPU's socket; a pod whose
// share is still being set up is admitted on the shim's next attempt, within a second.
const ReasonNoGPUShare = "NoGPUShare"

const (
	// admitLookupTimeout bounds the pod lookups of Admit. It runs between a shim's HELLO and its WELCOME,
	// first; the class and claim ledger lookups that follow find an admitted pod's process in the list
	// Admit read (only a container the list does not name yet costs the ledger's lookup its own 300 ms),
	// so the three stay within the shim's 1 s GPUSHARE_CONNECT_TIMEOUT_MS.
	admitLookupTimeout = 300 * time.Millisecond
	// noShareReportEvery bounds the log line and the event per pod and GPU: a refused shim tries again
	// every second or so for as long as its process runs.
	noShareReportEvery = time.Minute
)

// gpuClaims lists the claims the DRA kubelet plugin prepared on a GPU (*dra.KubeletPlugin).
type gpuClaims interface {
	ClaimsOnGPU(uuid string) []dra.GPUClaim
}

// shareGuard decides who may use a GPU's shim scheduler (scheduler.Guards.Admit). The socket's directory
// is a host path a pod can mount without being given it (any pod allowed hostPath volumes), and the socket
// takes every uid, so the control is here, per connection, from the kernel's pid of the peer:
//   - a process in no pod (the MPS server, nvidia-smi, a host tool) is admitted: who runs on the host as
//     root can reach the GPU and the socket anyway;
//   - a process of a pod is admitted when the pod holds a share of that GPU: a device of it that the
//     kubelet allocated through the device plugin (PodResources), or a claim the DRA kubelet plugin
//     prepared on it, of any kind, that lists the pod or that the pod names;
//   - anything else is refused, a lookup that fails included (fail closed): a process let in by mistake
//     keeps its lease for the life of its connection, one turned away tries again within a second.
type shareGuard struct {
	pods *podpid.Resolver
	// devices is the kubelet's device plugin allocations; nil where the device plugin does not run.
	devices *deviceplugin.PodHolders
	// claims is the DRA kubelet plugin's prepared claims; nil where it does not run.
	claims gpuClaims
	events events.EventRecorder
	log    logr.Logger
	node   string
	// reports bounds the refusals reported per pod and GPU (noShareReportEvery).
	reports *podGPULimit
}

// admit is scheduler.Guards.Admit.
func (g *shareGuard) admit(gpu string, pid int32) (bool, string) {
	ctx, cancel := context.WithTimeout(context.Background(), admitLookupTimeout)
	defer cancel()
	pod, where := g.pods.PodOf(ctx, pid)
	switch where {
	case podpid.OnHost:
		return true, ""
	case podpid.Unreadable:
		return false, "its cgroup cannot be read"
	case podpid.InUnlistedPod:
		return false, fmt.Sprintf("its pod (uid %s) is not among this node's pods as listed", pod.UID)
	}
	held, why := g.holds(ctx, pod, gpu)
	if !held {
		g.report(pod, gpu, pid, why)
	}
	return held, why
}

// holds says whether pod holds a share of GPU gpu, and if not, why.
func (g *shareGuard) holds(ctx context.Context, pod podpid.Pod, gpu string) (bool, string) {
	if g.claims != nil {
		for _, c := range g.claims.ClaimsOnGPU(gpu) {
			if c.Namespace == pod.Namespace && (slices.Contains(c.Pods, pod.Name) || slices.Contains(pod.Claims, c.Name)) {
				return true, ""
			}
		}
	}
	if g.devices != nil {
		held, err := g.devices.Holds(ctx, pod.Namespace, pod.Name, gpu)
		if err != nil {
			return false, fmt.Sprintf("the devices of pod %s/%s cannot be read: %v", pod.Namespace, pod.Name, err)
		}
		if held {
			return true, ""
		}
	}
	return false, fmt.Sprintf("pod %s/%s holds no share of GPU %s", pod.Namespace, pod.Name, gpu)
}

// report logs a refused pod and puts a warning event on it, at most once per noShareReportEvery for one
// pod and GPU.
func (g *shareGuard) report(pod podpid.Pod, gpu string, pid int32, why string) {
	if !g.reports.allow(types.UID(pod.UID), gpu) {
		return
	}
	g.log.Info("Refusing a shim client of a pod without a share of the GPU", "pod", pod.Namespace+"/"+pod.Name,
		"gpu", gpu, "pid", pid, "why", why)
	if g.events != nil {
		obj := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: types.UID(pod.UID)}}
		g.events.Eventf(obj, nil, corev1.EventTypeWarning, ReasonNoGPUShare, "Admit",
			"GPU %s on %s: %s; its process %d was refused the GPU's scheduler socket", gpu, g.node, why, pid)
	}
}

// admitGuard returns the scheduler's Admit for this agent, or nil where it cannot tell who holds a share:
// no pod resolver (no schedulers, or the demo's simulated nodes), or a device plugin whose allocations
// cannot be read (no PodResources socket), or neither the device plugin nor the DRA kubelet plugin
// giving out shares.
func admitGuard(mgr ctrl.Manager, o Options, pods *podpid.Resolver, podResources deviceplugin.PodResourcesLister, claims gpuClaims) func(string, int32) (bool, string) {
	log := mgr.GetLogger().WithName("shim-admit")
	switch {
	case pods == nil:
		return nil
	case o.DevicePlugin != nil && podResources == nil:
		log.Info("The shim schedulers admit every process: the device plugin runs without the kubelet's PodResources socket, so its pods' shares cannot be read")
		return nil
	case o.DevicePlugin == nil && claims == nil:
		log.Info("The shim schedulers admit every process: neither the device plugin nor the DRA kubelet plugin gives out shares here")
		return nil
	}
	g := &shareGuard{pods: pods, claims: claims, events: mgr.GetEventRecorder("gpusharing-agent"), log: log, node: o.NodeName,
		reports: &podGPULimit{every: noShareReportEvery, clock: o.Clock}}
	if o.DevicePlugin != nil {
		g.devices = &deviceplugin.PodHolders{Lister: podResources, Clock: o.Clock}
	}
	return g.admit
}
