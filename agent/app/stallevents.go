package app

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/gpusharing/gpusharing/agent/podpid"
	"github.com/gpusharing/gpusharing/agent/scheduler"
)

// ReasonStoppedWhileHolding is the reason of the warning event on a pod whose process held a GPU's lock
// while it was stopped (a stop signal, a debugger or profiler attached, its container paused or frozen
// for a checkpoint), and lost it to the pods that waited (scheduler/stall.go). What to do: nothing, if
// the stop was meant; the process asks again at its next GPU call. A production pod that is debugged in
// place loses its preemption only while stopped.
const ReasonStoppedWhileHolding = "StoppedWhileHolding"

// stallReportEvery bounds the event per pod and GPU: a process stopped and continued again and again (a
// debugger stepping) is revoked at each stop that lasts.
const stallReportEvery = time.Minute

// stallReporter puts a warning event on the pod of each holder revoked because its process was stopped.
type stallReporter struct {
	pods    *podpid.Resolver
	events  events.EventRecorder
	log     logr.Logger
	node    string
	reports *podGPULimit
}

// stallEvents returns the schedulers' Guards.OnStallRevoked for this agent; nil without a pod resolver
// (no schedulers, or the demo's simulated nodes).
func stallEvents(mgr ctrl.Manager, o Options, pods *podpid.Resolver) func(scheduler.StallRevocation) {
	if pods == nil {
		return nil
	}
	r := &stallReporter{pods: pods, events: mgr.GetEventRecorder("gpusharing-agent"), log: mgr.GetLogger().WithName("shim-stall"),
		node: o.NodeName, reports: &podGPULimit{every: stallReportEvery, clock: o.Clock}}
	return r.revoked
}

// revoked is Guards.OnStallRevoked: it must not block the scheduler, so the pod lookup runs on its own.
func (r *stallReporter) revoked(s scheduler.StallRevocation) {
	go r.report(s)
}

func (r *stallReporter) report(s scheduler.StallRevocation) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pod, where := r.pods.PodOf(ctx, s.PID)
	if where != podpid.InPod || !r.reports.allow(types.UID(pod.UID), s.GPU) {
		return
	}
	r.log.Info("A pod's process lost the GPU lock while stopped", "pod", pod.Namespace+"/"+pod.Name, "gpu", s.GPU,
		"pid", s.PID, "class", s.Class, "stopped", s.Stopped.Round(time.Millisecond))
	obj := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: types.UID(pod.UID)}}
	r.events.Eventf(obj, nil, corev1.EventTypeWarning, ReasonStoppedWhileHolding, "Revoke",
		"GPU %s on %s: process %d (%s) was stopped or frozen for %s while it held the GPU's lock and others waited; the lock went to them, and the process asks again at its next GPU call",
		s.GPU, r.node, s.PID, s.Class, s.Stopped.Round(time.Millisecond))
}
