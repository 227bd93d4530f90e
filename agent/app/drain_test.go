package app

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/fakekubelet"
)

// draining is a waitFor check: the GPU reports Applied=False Draining naming pod, with its drain block.
func draining(uuid, pod string, more ...string) func(*v1alpha1.GPUNode) (bool, string) {
	return func(g *v1alpha1.GPUNode) (bool, string) {
		reason, status, msg := applied(g, uuid)
		st := gpuState(g, uuid)
		ok := reason == v1alpha1.ReasonDraining && status == metav1.ConditionFalse && strings.Contains(msg, pod) &&
			st.Drain != nil && st.Drain.Phase == v1alpha1.DrainPhaseDraining && len(st.Drain.Pods) == 1 && st.Drain.Pods[0] == pod
		for _, m := range more {
			ok = ok && strings.Contains(msg, m)
		}
		return ok, fmt.Sprintf("%s/%s: %s; drain %+v", status, reason, msg, st.Drain)
	}
}

func migUUIDs(g *v1alpha1.GPUNode, uuid string) map[string]string {
	out := map[string]string{}
	for _, in := range gpuState(g, uuid).Applied.MIGInstances {
		out[in.UUID] = "Healthy"
	}
	return out
}

// (b) A MIG layout change on a GPU a pod uses: the GPU is cordoned (its devices leave ListAndWatch, the
// pod's own one once the pod is gone), the status says Draining and names the pod, nothing changes on the
// GPU until the pod ends, then the new layout is applied and advertised.
func TestMIGLayoutChangeWaitsForThePodUsingTheGPUThenAppliesAndAdvertisesAgain(t *testing.T) {
	n := startNode(t, 1)
	uuid := n.uuid(0)
	n.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Sharing: migSharing("1g.5gb", 2)})
	g := n.waitFor(t, "MIG 1g.5gb x2", appliedAsDesired(uuid))
	old := migUUIDs(g, uuid)
	n.waitDevices(t, "the old layout advertised", "nvidia.com/mig-1g.5gb", old)

	pod := runningPod(t, "train", nil)
	var oneMIG string
	for id := range old {
		oneMIG = id
		break
	}
	n.pods.SetPods(fakekubelet.Pod(pod.Namespace, pod.Name, "nvidia.com/mig-1g.5gb", oneMIG))
	podName := pod.Namespace + "/" + pod.Name

	// Enabling MIG above was a drain of an idle GPU already; count from here.
	drainsBefore, secondsBefore := drainObservations(t, uuid, "drained")
	n.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Sharing: migSharing("3g.20gb", 1), Drain: drainSpec(v1alpha1.DrainWaitForIdle, time.Minute)})
	n.waitFor(t, "Draining naming the pod", draining(uuid, podName, "waiting for 1 pods"))
	drainingSince := time.Now()
	n.waitDevices(t, "the cordoned GPU's MIG devices leave ListAndWatch but the pod's", "nvidia.com/mig-1g.5gb", map[string]string{oneMIG: "Healthy"})
	// Drain polls and a pass later the layout is untouched: the pod still holds the GPU.
	n.drainPolled(t)
	n.reconciled(t)
	g = n.get(t)
	if got := migUUIDs(g, uuid); len(got) != 2 {
		t.Fatalf("the layout changed while a pod used the GPU: instances %v", gpuState(g, uuid).Applied.MIGInstances)
	}
	if reason, _, _ := applied(g, uuid); reason != v1alpha1.ReasonDraining {
		t.Fatalf("Applied reason %s while the pod runs, want Draining", reason)
	}
	if c := n.get(t).Status.Conditions; !strings.Contains(conditionMessage(c, v1alpha1.ConditionApplied), podName) {
		t.Errorf("node Applied message %q does not name the pod", conditionMessage(c, v1alpha1.ConditionApplied))
	}

	// The pod ends: the kubelet drops it, the API server reports it Succeeded.
	held := time.Since(drainingSince)
	env.SetPodPhase(t, context.Background(), pod, corev1.PodSucceeded)
	n.pods.RemovePod(pod.Namespace, pod.Name)
	g = n.waitFor(t, "MIG 3g.20gb x1 applied after the pod ended", appliedAsDesired(uuid))
	if st := gpuState(g, uuid); st.Drain != nil || len(st.Applied.MIGInstances) != 1 || st.Applied.MIGInstances[0].Profile != "3g.20gb" {
		t.Fatalf("after the drain: drain %+v instances %+v; want no drain block and one 3g.20gb", st.Drain, st.Applied.MIGInstances)
	}
	n.waitDevices(t, "the new layout advertised", "nvidia.com/mig-3g.20gb", migUUIDs(g, uuid))
	n.waitDevices(t, "the old profile gone", "nvidia.com/mig-1g.5gb", nil)
	// The drain lasted at least as long as the pod was held above once the status said Draining.
	if count, sum := drainObservations(t, uuid, "drained"); count-drainsBefore != 1 || sum-secondsBefore < held.Seconds() {
		t.Errorf("gpusharing_agent_drain_duration_seconds{outcome=drained}: %d more observations summing %.2fs, want 1 of at least %.2fs",
			count-drainsBefore, sum-secondsBefore, held.Seconds())
	}
}

// drainObservations reads the agent's drain histogram for one GPU and outcome from the metrics registry
// the agent's /metrics endpoint serves.
func drainObservations(t *testing.T, uuid, outcome string) (count uint64, sum float64) {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "gpusharing_agent_drain_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["gpu"] == uuid && labels["outcome"] == outcome {
				return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
			}
		}
	}
	return 0, 0
}

// (c) Evict mode with a PodDisruptionBudget that refuses: the agent keeps the GPU cordoned and says the
// eviction is blocked, the pod stays; once the budget allows it, the pod is evicted and the change applied.
func TestEvictWaitsWhileABudgetBlocksAndSaysSoThenApplies(t *testing.T) {
	n := startNode(t, 1)
	uuid := n.uuid(0)
	n.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Sharing: exclusive()})
	n.waitFor(t, "Exclusive", appliedAsDesired(uuid))
	n.waitDevices(t, "the whole GPU advertised", "nvidia.com/gpu", map[string]string{uuid: "Healthy"})

	labels := map[string]string{"app": "inference"}
	pod := runningPod(t, "server", labels)
	podName := pod.Namespace + "/" + pod.Name
	n.pods.SetPods(fakekubelet.Pod(pod.Namespace, pod.Name, "nvidia.com/gpu", uuid))
	pdb := env.BlockingPDB(t, context.Background(), pod.Namespace, labels)

	n.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Sharing: timeSlicing(4), Drain: drainSpec(v1alpha1.DrainEvict, time.Minute)})
	n.waitFor(t, "Draining, eviction blocked by the budget", draining(uuid, podName, "evicting 1 pods", "disruption budget"))
	// Held by the pod, the cordoned GPU stays advertised (Allocate refuses it) until the pod is gone.
	n.waitDevices(t, "the cordoned GPU advertised while its pod holds it", "nvidia.com/gpu", map[string]string{uuid: "Healthy"})
	// More polls, each trying the eviction again, and a pass: the pod is still untouched.
	n.drainPolled(t)
	n.reconciled(t)
	var p corev1.Pod
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(pod), &p); err != nil || p.DeletionTimestamp != nil {
		t.Fatalf("pod while the budget blocks: %v, deleting=%v; want it untouched", err, p.DeletionTimestamp != nil)
	}
	if reason, _, _ := applied(n.get(t), uuid); reason != v1alpha1.ReasonDraining {
		t.Fatalf("Applied reason %s while the budget blocks, want Draining", reason)
	}

	env.SetPDBAllowed(t, context.Background(), pdb, 1)
	g := n.waitFor(t, "TimeSlicing applied after the eviction", appliedAsDesired(uuid))
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(pod), &p); !apierrors.IsNotFound(err) {
		t.Errorf("pod after the drain: %v, want evicted (NotFound)", err)
	}
	if st := gpuState(g, uuid); st.Drain != nil || st.Applied.Strategy != v1alpha1.StrategyTimeSlicing {
		t.Errorf("after the drain: drain %+v strategy %s", st.Drain, st.Applied.Strategy)
	}
	n.waitDevices(t, "time-slice replicas advertised", "gpusharing.io/gpu-timeslice", replicas(uuid, 4, nil))
}

// (d) A drain that times out leaves the GPU as it was and advertises it again, reports Applied=False
// DrainTimedOut naming the pod, and does not drain again until the backoff passes or the spec changes.
func TestDrainTimeoutLeavesTheGPUAsItWasAdvertisedAndDoesNotRetryInALoop(t *testing.T) {
	n := startNode(t, 1)
	uuid := n.uuid(0)
	n.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Sharing: exclusive()})
	n.waitFor(t, "Exclusive", appliedAsDesired(uuid))

	pod := runningPod(t, "notebook", nil)
	podName := pod.Namespace + "/" + pod.Name
	n.pods.SetPods(fakekubelet.Pod(pod.Namespace, pod.Name, "nvidia.com/gpu", uuid))
	n.mpsCtl.Calls(t)

	n.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Sharing: mpsSharing(4), Drain: drainSpec(v1alpha1.DrainWaitForIdle, time.Second)})
	g := n.waitFor(t, "Applied=False DrainTimedOut", func(g *v1alpha1.GPUNode) (bool, string) {
		reason, status, msg := applied(g, uuid)
		return reason == v1alpha1.ReasonDrainTimedOut && status == metav1.ConditionFalse, fmt.Sprintf("%s/%s: %s", status, reason, msg)
	})
	_, _, msg := applied(g, uuid)
	st := gpuState(g, uuid)
	for _, want := range []string{podName, "left as it was", "advertised again", "MPS x4"} {
		if !strings.Contains(msg, want) {
			t.Errorf("DrainTimedOut message %q does not say %q", msg, want)
		}
	}
	if st.Drain == nil || st.Drain.Phase != v1alpha1.DrainPhaseTimedOut || st.Drain.RetryTime == nil || len(st.Drain.Pods) != 1 || st.Drain.Pods[0] != podName {
		t.Errorf("drain block %+v: want TimedOut with the pod and a retry time", st.Drain)
	}
	if st.Applied.Strategy != v1alpha1.StrategyExclusive {
		t.Errorf("applied strategy %s after the timeout, want the GPU left Exclusive", st.Applied.Strategy)
	}
	if calls := n.mpsCtl.Calls(t); len(calls) != 0 {
		t.Errorf("the MPS daemon was touched after a timed-out drain: %v", calls)
	}
	if count, sum := drainObservations(t, uuid, "timed_out"); count != 1 || sum < 1 {
		t.Errorf("gpusharing_agent_drain_duration_seconds{outcome=timed_out}: %d observations summing %.2fs, want 1 of at least the 1s timeout", count, sum)
	}
	if got := conditionReason(g.Status.Conditions, v1alpha1.ConditionApplied); got != v1alpha1.ReasonDrainTimedOut {
		t.Errorf("node Applied reason %s, want DrainTimedOut", got)
	}
	n.waitDevices(t, "the GPU advertised again as it is", "nvidia.com/gpu", map[string]string{uuid: "Healthy"})

	// No tight retry: the kubelet is not asked again while the backoff (an hour here) runs, however often
	// the agent looks at its GPUNode (twice here: a drain the first pass started has listed by the second).
	lists := n.pods.Lists()
	n.reconciled(t)
	n.reconciled(t)
	if got := n.pods.Lists(); got != lists {
		t.Errorf("PodResources listed %d more times after the timeout; want no drain until the backoff or a spec change", got-lists)
	}
	if got := n.kubelet.Devices("nvidia.com/gpu"); got[uuid] != "Healthy" {
		t.Errorf("kubelet's nvidia.com/gpu %v during the backoff; want the GPU advertised", got)
	}

	// A spec change drains again at once: this time the pod is gone.
	n.pods.SetPods()
	n.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Sharing: mpsSharing(2), Drain: drainSpec(v1alpha1.DrainWaitForIdle, time.Second)})
	n.waitFor(t, "MPS x2 applied after the spec changed", appliedAsDesired(uuid))
	n.waitDevices(t, "MPS replicas advertised", "gpusharing.io/gpu-mps", replicas(uuid, 2, nil))
}

func conditionMessage(conds []metav1.Condition, typ string) string {
	for _, c := range conds {
		if c.Type == typ {
			return c.Message
		}
	}
	return ""
}

func conditionReason(conds []metav1.Condition, typ string) string {
	for _, c := range conds {
		if c.Type == typ {
			return c.Reason
		}
	}
	return ""
}

// Processes NVML sees that belong to no pod still block the change with GPUBusy and their pids: the drain
// finds no pod, the change is refused, and the GPU is advertised again until the backoff or a spec change.
func TestNodeLevelProcessesStillBlockWithGPUBusyAfterTheDrain(t *testing.T) {
	n := startNode(t, 1)
	uuid := n.uuid(0)
	n.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Sharing: migSharing("1g.5gb", 2)})
	g := n.waitFor(t, "MIG 1g.5gb x2", appliedAsDesired(uuid))
	old := migUUIDs(g, uuid)
	n.gpus.GPUs[0].SetProcesses(4242)

	n.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Sharing: migSharing("3g.20gb", 1), Drain: drainSpec(v1alpha1.DrainWaitForIdle, time.Minute)})
	g = n.waitFor(t, "Applied=False GPUBusy", func(g *v1alpha1.GPUNode) (bool, string) {
		reason, status, msg := applied(g, uuid)
		return reason == v1alpha1.ReasonGPUBusy && status == metav1.ConditionFalse, fmt.Sprintf("%s/%s: %s", status, reason, msg)
	})
	st := gpuState(g, uuid)
	if len(st.Processes) != 1 || st.Processes[0] != 4242 {
		t.Errorf("processes %v, want the node-level pid 4242", st.Processes)
	}
	if st.Drain == nil || st.Drain.Phase != v1alpha1.DrainPhaseFailed || st.Drain.RetryTime == nil {
		t.Errorf("drain block %+v, want Failed with a retry time", st.Drain)
	}
	if got := migUUIDs(g, uuid); len(got) != 2 {
		t.Errorf("instances %v; want the old layout kept", st.Applied.MIGInstances)
	}
	n.waitDevices(t, "the old layout advertised again", "nvidia.com/mig-1g.5gb", old)
}

// A spec that goes back to what the GPU runs while it is drained cancels the drain: the GPU is advertised
// again at once and reports its sharing as desired.
func TestRevertingTheSpecDuringADrainCancelsItAndAdvertisesTheGPUAgain(t *testing.T) {
	n := startNode(t, 1)
	uuid := n.uuid(0)
	n.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Sharing: exclusive()})
	n.waitFor(t, "Exclusive", appliedAsDesired(uuid))
	pod := runningPod(t, "job", nil)
	podName := pod.Namespace + "/" + pod.Name
	n.pods.SetPods(fakekubelet.Pod(pod.Namespace, pod.Name, "nvidia.com/gpu", uuid))

	n.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Sharing: mpsSharing(4), Drain: drainSpec(v1alpha1.DrainWaitForIdle, time.Minute)})
	n.waitFor(t, "Draining naming the pod", draining(uuid, podName))
	// The pod still holds the GPU, so it stays advertised (held: Allocate refuses it) and keeps counting
	// in the node's allocatable as the pod counts in its requests.
	n.waitDevices(t, "the cordoned GPU advertised while its pod holds it", "nvidia.com/gpu", map[string]string{uuid: "Healthy"})

	n.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Sharing: exclusive()})
	g := n.waitFor(t, "Exclusive again", appliedAsDesired(uuid))
	if st := gpuState(g, uuid); st.Drain != nil {
		t.Errorf("drain block %+v after the spec went back; want none", st.Drain)
	}
	n.waitDevices(t, "the GPU advertised again", "nvidia.com/gpu", map[string]string{uuid: "Healthy"})
	lists := n.pods.Lists()
	n.reconciled(t)
	n.reconciled(t)
	if got := n.pods.Lists(); got != lists {
		t.Errorf("PodResources listed %d more times after the drain was cancelled", got-lists)
	}
}
