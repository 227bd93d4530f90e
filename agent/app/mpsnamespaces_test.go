package app

import (
	"context"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"k8s.io/client-go/tools/events"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpusharing/gpusharing/agent/share"
)

// podResourcesList is a kubelet's PodResources answer, changed between calls by the test.
type podResourcesList struct {
	pods []*podresourcesv1.PodResources
}

func (l *podResourcesList) List(context.Context, *podresourcesv1.ListPodResourcesRequest, ...grpc.CallOption) (*podresourcesv1.ListPodResourcesResponse, error) {
	return &podresourcesv1.ListPodResourcesResponse{PodResources: l.pods}, nil
}

func podHolding(ns, name, resource string, ids ...string) *podresourcesv1.PodResources {
	return &podresourcesv1.PodResources{Namespace: ns, Name: name, Containers: []*podresourcesv1.ContainerResources{{Name: "main",
		Devices: []*podresourcesv1.ContainerDevices{{ResourceName: resource, DeviceIds: ids}}}}}
}

// The device plugin's MPS shares of a GPU all reach the GPU's one daemon: when pods of two namespaces
// hold them, the agent names the GPU and the namespaces in a warning on the GPUNode, once per change of
// the namespaces, and not for one namespace's pods, other GPUs or other resources.
func TestTheAgentNamesAGPUWhoseMPSDaemonServesPodsOfSeveralNamespaces(t *testing.T) {
	const mps = "gpusharing.io/gpu-mps"
	list := &podResourcesList{}
	rec := events.NewFakeRecorder(10)
	w := &mpsNamespaces{lister: list, resource: mps, events: rec, node: "node-a", log: logr.Discard()}
	check := func(when string, want ...string) {
		t.Helper()
		if err := w.check(context.Background()); err != nil {
			t.Fatal(err)
		}
		var got []string
		for len(rec.Events) > 0 {
			got = append(got, <-rec.Events)
		}
		if len(got) != len(want) {
			t.Fatalf("%s: events %q, want %d naming %q", when, got, len(want), want)
		}
		for i, w := range want {
			if !strings.HasPrefix(got[i], "Warning "+ReasonMPSNamespacesShareADaemon+" ") || !strings.Contains(got[i], w) {
				t.Errorf("%s: event %q, want a warning %s naming %q", when, got[i], ReasonMPSNamespacesShareADaemon, w)
			}
		}
	}
	gpuA, gpuB := share.ReplicaID("GPU-a", 0), share.ReplicaID("GPU-b", 0)
	list.pods = []*podresourcesv1.PodResources{
		podHolding("team-a", "one", mps, gpuA), podHolding("team-a", "two", mps, share.ReplicaID("GPU-a", 1)),
		podHolding("team-b", "one", "gpusharing.io/gpu-timeslice", share.ReplicaID("GPU-a", 0)),
		podHolding("team-b", "two", mps, gpuB),
	}
	check("one namespace per MPS GPU")
	list.pods = append(list.pods, podHolding("team-b", "three", mps, share.ReplicaID("GPU-a", 2)))
	check("team-b joins team-a on GPU-a", "GPU GPU-a: device plugin MPS shares are held by pods of namespaces team-a, team-b")
	check("nothing changed")
	list.pods = append(list.pods, podHolding("team-c", "one", mps, share.ReplicaID("GPU-a", 3)))
	check("team-c joins too", "namespaces team-a, team-b, team-c")
	list.pods = list.pods[:4]
	check("back to one namespace")
	list.pods = append(list.pods, podHolding("team-b", "three", mps, share.ReplicaID("GPU-a", 2)))
	check("shared again", "namespaces team-a, team-b")
}
