package app

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// slicedDevices lists the device names of node's ResourceSlices and their pool generation.
func slicedDevices(t *testing.T, node string) (string, int64, []metav1.OwnerReference) {
	t.Helper()
	var list resourcev1.ResourceSliceList
	if err := env.Client.List(context.Background(), &list); err != nil {
		t.Fatal(err)
	}
	var names []string
	var gen int64
	var owners []metav1.OwnerReference
	for _, s := range list.Items {
		if s.Spec.NodeName == nil || *s.Spec.NodeName != node || s.Spec.Driver != dra.DriverName {
			continue
		}
		gen, owners = s.Spec.Pool.Generation, s.OwnerReferences
		for _, d := range s.Spec.Devices {
			names = append(names, d.Name)
		}
	}
	sort.Strings(names)
	return strings.Join(names, " "), gen, owners
}

func waitSlices(t *testing.T, node, want string) int64 {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, gen, _ := slicedDevices(t, node)
		if got == want {
			return gen
		}
		if time.Now().After(deadline) {
			t.Fatalf("ResourceSlices of %s list %q, want %q", node, got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestAgentPublishesItsAppliedSharingAsResourceSlices(t *testing.T) {
	n := startNodeWith(t, 2, func(o *Options) { o.ResourceSlices = true })
	// The slices are owned by the Node (nothing runs a kubelet here to register it).
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}
	if err := env.Client.Create(context.Background(), node); err != nil {
		t.Fatal(err)
	}
	n.setSpec(t,
		v1alpha1.GPUDesired{UUID: n.uuid(0), Index: 0, Sharing: mpsSharing(2)},
		v1alpha1.GPUDesired{UUID: n.uuid(1), Index: 1, Sharing: exclusive()},
	)
	gen := waitSlices(t, n.name, "gpu-0-mps-0 gpu-0-mps-1 gpu-1")
	if _, _, owners := slicedDevices(t, n.name); len(owners) != 1 || owners[0].Kind != "Node" || owners[0].UID != node.UID {
		t.Errorf("slice owners = %+v, want the Node", owners)
	}
	// A policy change is published under a new pool generation.
	n.setSpec(t,
		v1alpha1.GPUDesired{UUID: n.uuid(0), Index: 0, Sharing: timeSlicing(3)},
		v1alpha1.GPUDesired{UUID: n.uuid(1), Index: 1, Sharing: exclusive()},
	)
	if gen2 := waitSlices(t, n.name, "gpu-0-timeslicing-0 gpu-0-timeslicing-1 gpu-0-timeslicing-2 gpu-1"); gen2 <= gen {
		t.Errorf("pool generation %d after the change, was %d", gen2, gen)
	}
}
