package app

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// A node serving the device plugin beside DRA leaves to DRA the extended resources the DeviceClasses
// (config/dra) name: with the classes installed, less gpusharing-mps, the kubelet sees only
// gpusharing.io/gpu-mps registered, never nvidia.com/gpu, gpusharing.io/gpu-timeslice or the MIG profile;
// deleting the time-slicing class gives its name back to the device plugin.
func TestBesideDRATheDevicePluginLeavesTheClassesNamesToIt(t *testing.T) {
	ctx := context.Background()
	classes, err := env.DeviceClasses()
	if err != nil {
		t.Fatal(err)
	}
	if err := env.ApplyDeviceClasses(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for i := range classes {
			_ = client.IgnoreNotFound(env.Client.Delete(ctx, &classes[i]))
		}
	})
	if err := env.Client.Delete(ctx, &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpusharing-mps"}}); err != nil {
		t.Fatal(err)
	}
	n := startNodeWith(t, 4, func(o *Options) { o.ResourceSlices = true })
	if err := env.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}); err != nil {
		t.Fatal(err)
	}
	n.setSpec(t,
		v1alpha1.GPUDesired{UUID: n.uuid(0), Index: 0, Sharing: exclusive()},
		v1alpha1.GPUDesired{UUID: n.uuid(1), Index: 1, Sharing: timeSlicing(2)},
		v1alpha1.GPUDesired{UUID: n.uuid(2), Index: 2, Sharing: migSharing("1g.5gb", 1)},
		v1alpha1.GPUDesired{UUID: n.uuid(3), Index: 3, Sharing: mpsSharing(2)},
	)
	n.waitFor(t, "every GPU applied", appliedAsDesired(n.uuid(0), n.uuid(1), n.uuid(2), n.uuid(3)))
	n.waitDevices(t, "the MPS replicas no class names", "gpusharing.io/gpu-mps", replicas(n.uuid(3), 2, nil))
	for _, res := range []string{"nvidia.com/gpu", "gpusharing.io/gpu-timeslice", "nvidia.com/mig-1g.5gb"} {
		if r := n.kubelet.Registrations(res); len(r) != 0 {
			t.Errorf("%s, which a DeviceClass names, registered with the kubelet %d times", res, len(r))
		}
	}

	if err := env.Client.Delete(ctx, &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpusharing-timeslicing"}}); err != nil {
		t.Fatal(err)
	}
	n.waitDevices(t, "time-slice replicas once no class names them", "gpusharing.io/gpu-timeslice", replicas(n.uuid(1), 2, nil))
	if r := n.kubelet.Registrations("nvidia.com/gpu"); len(r) != 0 {
		t.Errorf("nvidia.com/gpu registered %d times while gpusharing-exclusive names it", len(r))
	}
}
