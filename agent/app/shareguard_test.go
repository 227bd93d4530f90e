package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/hostpath"
	"github.com/gpusharing/gpusharing/agent/scheduler"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/fakekubelet"
	"github.com/gpusharing/gpusharing/test/prom"
	"github.com/gpusharing/gpusharing/test/shimclient"
	"github.com/gpusharing/gpusharing/test/wait"
)

// guardPod creates pod name on node, with the ResourceClaims it names in its spec (none: none).
func guardPod(t *testing.T, name, node string, claims ...string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "main", Image: "trainer"}}}}
	for i, c := range claims {
		p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: fmt.Sprintf("c%d", i), ResourceClaimName: ptr.To(c)})
	}
	if err := env.Client.Create(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), p, client.GracePeriodSeconds(0)) })
	return p
}

// runAs makes this test process, which is every shim client of these tests (the scheduler reads its pid
// from the socket), look to the agent as a process of pod p (nil: of the host) through its cgroup file.
func runAs(t *testing.T, procRoot string, p *corev1.Pod) {
	t.Helper()
	dir := filepath.Join(procRoot, fmt.Sprint(os.Getpid()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cg := "0::/system.slice/nvidia-persistenced.service\n"
	if p != nil {
		cg = fmt.Sprintf("0::/kubepods/burstable/pod%s/%064x\n", p.UID, 1)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cg), 0o644); err != nil {
		t.Fatal(err)
	}
}

// noShareRefusals is gpusharing_scheduler_connections_refused_total{gpu, reason="no-share"}.
func noShareRefusals(t *testing.T, gpu string) float64 {
	t.Helper()
	v, _ := prom.Find(t, metrics.Registry, "gpusharing_scheduler_connections_refused_total",
		map[string]string{"gpu": gpu, "reason": scheduler.RefuseNoShare})
	return v
}

// greet says HELLO on the GPU's socket and reports whether the connection ended before any byte of a
// WELCOME, counted as a no-share refusal, and what happened otherwise.
func greet(t *testing.T, sock, gpu string) (refused bool, state string) {
	t.Helper()
	before := noShareRefusals(t, gpu)
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hello, _ := scheduler.Encode(scheduler.Message{Type: scheduler.MsgHello, PID: uint32(os.Getpid()), GPUUUID: gpu})
	if _, err := conn.Write(hello); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [1]byte
	if n, err := conn.Read(b[:]); n != 0 || !errors.Is(err, io.EOF) {
		return false, fmt.Sprintf("the scheduler answered (%d bytes, %v), want the connection closed before any WELCOME", n, err)
	}
	if got := noShareRefusals(t, gpu); got != before+1 {
		return false, fmt.Sprintf("no-share refusals %v, want %v", got, before+1)
	}
	// A greeting of this process within RepeatWindow would be refused as this attempt's repeat, without
	// asking about the pod the test runs it as next; a shim's next attempt comes after its back-off.
	time.Sleep(scheduler.RepeatWindow)
	return true, ""
}

// expectRefused fails the test unless a HELLO on the GPU's socket is refused as no-share.
func expectRefused(t *testing.T, sock, gpu, who string) {
	t.Helper()
	if ok, state := greet(t, sock, gpu); !ok {
		t.Fatalf("%s: %s", who, state)
	}
}

// oversubscribedSocket applies an oversubscribed time-sliced GPU 0 on n and returns its scheduler's socket.
func oversubscribedSocket(t *testing.T, n *testNode) string {
	t.Helper()
	uuid := n.uuid(0)
	n.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Index: 0, Sharing: oversubscribedTimeSlicing(2, 3*time.Second, "8Gi")})
	n.waitFor(t, "GPU 0 time-sliced with oversubscription", appliedAsDesired(uuid))
	return hostpath.SchedulerSocket(filepath.Join(n.dir, "s"), uuid)
}

// A GPU's scheduler socket, reachable by any pod that mounts its host path, serves the processes of the
// pods the kubelet allocated a share of that GPU through the device plugin, and host processes; a process
// of a pod holding none, or of a pod this node does not run, is refused before WELCOME, counted, and its
// pod gets a warning event.
func TestSchedulerSocketRefusesPodsWithoutADevicePluginShareOfItsGPU(t *testing.T) {
	procRoot := t.TempDir()
	n := startNodeWith(t, 1, func(o *Options) { o.ProcRoot = procRoot })
	uuid := n.uuid(0)
	sock := oversubscribedSocket(t, n)
	holder := guardPod(t, "holder-"+n.name, n.name)
	stranger := guardPod(t, "stranger-"+n.name, n.name)
	elsewhere := guardPod(t, "elsewhere-"+n.name, n.name+"-other")
	n.pods.SetPods(fakekubelet.Pod("default", holder.Name, "gpusharing.io/gpu-shared", share.ReplicaID(uuid, 0)),
		// A device of another GPU is no share of this one.
		fakekubelet.Pod("default", stranger.Name, "gpusharing.io/gpu-shared", share.ReplicaID("GPU-another", 0)))

	runAs(t, procRoot, stranger)
	expectRefused(t, sock, uuid, "a pod holding no share of the GPU")
	wait.UntilState(t, 30*time.Second, func() (bool, string) {
		got := eventsAbout(t, "Pod", stranger.Name, ReasonNoGPUShare)
		return len(got) == 1 && strings.HasPrefix(got[0], "Warning: ") && strings.Contains(got[0], "holds no share of GPU "+uuid),
			fmt.Sprintf("events on the pod: %q", got)
	}, "a warning event on the refused pod")
	runAs(t, procRoot, elsewhere)
	expectRefused(t, sock, uuid, "a pod of another node")

	runAs(t, procRoot, holder)
	shimclient.Dial(t, sock, uuid)
	runAs(t, procRoot, nil)
	shimclient.Dial(t, sock, uuid)
	n.waitFor(t, "the holder's and the host's clients in status", shimClients(uuid, 3*time.Second, 2, 0))

	// Fail closed: with the kubelet's PodResources gone, the holder's next process cannot be checked
	// once the last list is older than a second, and is refused; the host is still served.
	n.pods.Stop()
	runAs(t, procRoot, holder)
	wait.UntilState(t, 10*time.Second, func() (bool, string) { return greet(t, sock, uuid) },
		"a pod whose allocations cannot be read is refused")
	runAs(t, procRoot, nil)
	shimclient.Dial(t, sock, uuid)
}

// Where DRA gives out the shares, the socket serves the pods of every claim the kubelet plugin prepared on
// the GPU: the pod the claim was reserved for when prepared, and a pod that names the claim and shares it
// since (the kubelet prepares a claim once per node). A pod whose claim is on no share of the GPU is refused.
func TestSchedulerSocketServesThePodsOfClaimsPreparedOnItsGPU(t *testing.T) {
	ctx := context.Background()
	procRoot := t.TempDir()
	n, plugin := startDRANode(t, func(o *Options) { o.ProcRoot = procRoot })
	uuid := n.uuid(0)
	sock := oversubscribedSocket(t, n)
	waitSlices(t, n.name, "gpu-0-shared-0 gpu-0-shared-1")

	claimName := "team-" + n.name
	first := guardPod(t, "first-"+n.name, n.name, claimName)
	later := guardPod(t, "later-"+n.name, n.name, claimName)
	stranger := guardPod(t, "stranger-"+n.name, n.name, "other-"+n.name)
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: claimName},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpu",
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpusharing-shared"}}}}}}
	if err := env.Client.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), claim) })
	claim.Status.Allocation = &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{
		Results: []resourcev1.DeviceRequestAllocationResult{{Request: "gpu", Driver: dra.DriverName, Pool: n.name, Device: "gpu-0-shared-0"}}}}
	claim.Status.ReservedFor = []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: first.Name, UID: first.UID}}
	if err := env.Client.Status().Update(ctx, claim); err != nil {
		t.Fatal(err)
	}
	prepareAsKubelet(t, ctx, pluginClient(t, plugin.PluginDir), claim)

	runAs(t, procRoot, stranger)
	expectRefused(t, sock, uuid, "a pod whose claim is on no share of the GPU")
	runAs(t, procRoot, first)
	shimclient.Dial(t, sock, uuid)
	runAs(t, procRoot, later)
	shimclient.Dial(t, sock, uuid)
	n.waitFor(t, "both pods' clients in status", shimClients(uuid, 3*time.Second, 2, 0))
}
