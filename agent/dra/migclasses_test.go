package dra_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/test/testenv"
)

// Each MIG profile's DeviceClass (config/dra/deviceclasses-mig.yaml) names exactly the extended resource
// the device plugin advertises for that profile and selects that profile's fixed instances, and every
// profile of the simulated GPU models (the A100 and H100 mocks, the recorded H200) has one, so a pod
// asking nvidia.com/mig-<profile> is served through DRA wherever the device plugin would have served it.
func TestEveryMIGProfileHasAClassNamingTheDevicePluginsResource(t *testing.T) {
	env := &testenv.Env{RepoRoot: testenv.RepoRoot()}
	classes, err := env.DeviceClasses()
	if err != nil {
		t.Fatal(err)
	}
	names := share.DefaultConfig()
	byResource := map[share.ResourceName]string{}
	for _, c := range classes {
		profile, ok := strings.CutPrefix(c.Name, "gpusharing-mig-")
		if !ok || profile == "dynamic" {
			continue
		}
		if c.Spec.ExtendedResourceName == nil {
			t.Errorf("DeviceClass %s names no extended resource", c.Name)
			continue
		}
		res := share.ResourceName(*c.Spec.ExtendedResourceName)
		byResource[res] = c.Name
		if len(c.Spec.Selectors) != 1 || c.Spec.Selectors[0].CEL == nil {
			t.Errorf("DeviceClass %s: want one CEL selector", c.Name)
			continue
		}
		expr := c.Spec.Selectors[0].CEL.Expression
		// The class name carries the resource's spelling (a '+' as '.'); the selector the profile's own.
		if !strings.HasPrefix(string(res), names.Resources.MIGPrefix) || c.Name != "gpusharing-mig-"+strings.TrimPrefix(string(res), names.Resources.MIGPrefix) {
			t.Errorf("DeviceClass %s names %s", c.Name, res)
		}
		var selected string
		if _, err := fmt.Sscanf(expr[strings.Index(expr, "migProfile == ")+len("migProfile == "):], "%q", &selected); err != nil || names.MIGResource(selected) != res {
			t.Errorf("DeviceClass %s selects profile %q (%v) but names %s", c.Name, selected, err, res)
		}
		if !strings.Contains(expr, `share == "MIG"`) || !strings.Contains(expr, `device.driver == "gpu.gpusharing.io"`) {
			t.Errorf("DeviceClass %s selects %s: want this driver's fixed MIG instances", c.Name, expr)
		}
	}
	for _, model := range []string{"A100", "H100", "H200"} {
		server, err := nvmlmock.NewNode(model, 1, 1)
		if err != nil {
			t.Fatal(err)
		}
		inv, err := gpu.NewNVML(server).Inventory(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range inv.Devices[0].Profiles {
			if _, ok := byResource[names.MIGResource(p.Name)]; !ok {
				t.Errorf("%s's profile %s has no DeviceClass naming %s", model, p.Name, names.MIGResource(p.Name))
			}
		}
	}
}
