package app

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/wait"
)

// Through the whole agent: the claim its kubelet plugin prepared shows in its own status.devices what
// its pod's process holds, as the accounting reads it.
func TestAgentWritesAPreparedSizedClaimsUseIntoItsDeviceStatus(t *testing.T) {
	pc := prepareSizedClaim(t, v1alpha1.Sizing{Mode: v1alpha1.SizingPerClaim})
	wait.UntilState(t, 30*time.Second, func() (bool, string) {
		var c resourcev1.ResourceClaim
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(pc.claim), &c); err != nil {
			return false, err.Error()
		}
		if len(c.Status.Devices) != 1 || c.Status.Devices[0].Data == nil {
			return false, fmt.Sprintf("status.devices %+v", c.Status.Devices)
		}
		var u dra.DeviceUsage
		if err := json.Unmarshal(c.Status.Devices[0].Data.Raw, &u); err != nil {
			return false, err.Error()
		}
		d := c.Status.Devices[0]
		return d.Driver == dra.DriverName && d.Device == "gpu-0-sized" && len(u.Pods) == 1 && u.Pods[0] == pc.pod.Name &&
			u.MemoryBytes == 3<<30 && u.PeakMemoryBytes == 3<<30, string(d.Data.Raw)
	}, "the claim's device status shows its pod's 3Gi")
}
