package app

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// A node serving the device plugin beside DRA leaves to DRA the extended resources the DeviceClasses
// (config/dra) name: with the classes installed the kubelet never sees nvidia.com/gpu or
// gpusharing.io/gpu-timeslice registered, only the MIG profile no class names; deleting the
// time-slicing class gives its name back to the device plugin.
func TestBesideDRATheDevicePluginLeavesTheClassesNamesToIt(t *testing.T) {
	ctx := context.Background()
	if err := env.ApplyDeviceClasses(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, name := range []string{"gpusharing-exclusive", "gpusharing-mig", "gpusharing-mps", "gpusharing-timeslicing",
			"gpusharing-shared", "gpusharing-sized", "gpusharing-mig-dynamic"} {
			_ = client.IgnoreNotFound(env.Client.Delete(ctx, &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}}))
		}
	})
	n := startNodeWith(t, 3, func(o *Options) { o.ResourceSlices = true })
	if err := env.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}); err != nil {
		t.Fatal(err)
	}
	n.setSpec(t,
		v1alpha1.GPUDesired{UUID: n.uuid(0), Index: 0, Sharing: exclusive()},
		v1alpha1.GPUDesired{UUID: n.uuid(1), Index: 1, Sharing: timeSlicing(2)},
		v1alpha1.GPUDesired{UUID: n.uuid(2), Index: 2, Sharing: migSharing("1g.5gb", 1)},
	)
	g := n.waitFor(t, "every GPU applied", appliedAsDesired(n.uuid(0), n.uuid(1), n.uuid(2)))
	mig := migUUIDs(g, n.uuid(2))
	var migDevice string
	for id := range mig {
		migDevice = "gpu-2-mig-" + strings.TrimPrefix(id, "MIG-")
	}
	waitSlices(t, n.name, "gpu-0 gpu-1-timeslicing-0 gpu-1-timeslicing-1 "+migDevice)
	n.waitDevices(t, "the MIG profile no class names", "nvidia.com/mig-1g.5gb", mig)
	for _, res := range []string{"nvidia.com/gpu", "gpusharing.io/gpu-timeslice"} {
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
