// Command dynmig measures what creating a MIG instance on demand costs a claim: the DRA kubelet plugin
// prepares and unprepares claims on a mocked H100 (its recorded MIG geometry) side by side, one claim
// of a dynamic MIG placement (the GPU and compute instances created at prepare and destroyed at
// unprepare, the ledger and the checkpoint written) and one of a fixed instance created ahead (the CDI
// spec and the checkpoint only), alternating in one run. The mock answers NVML at once: the driver's own
// time to create and destroy an instance on a real GPU comes on top (docs/dra.md). Run it with
// `make bench-dynmig` (BENCH_ARGS="-claims 500").
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/go-logr/logr"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/agent/node"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

const nodeName = "bench-node"

func main() {
	claims := flag.Int("claims", 200, "claims prepared and unprepared of each kind")
	flag.Parse()
	if err := run(*claims); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(n int) error {
	ctx := context.Background()
	srv, err := nvmlmock.NewNode("H100", 2, 0)
	if err != nil {
		return err
	}
	nv := gpu.NewNVML(srv)
	for _, g := range srv.GPUs {
		g.SetMIGMode(true, true)
	}
	// GPU 1 holds a fixed 3g.40gb at 4-7, created ahead as a MIG layout is.
	fixedDev, err := nv.Device(ctx, srv.GPUs[1].UUID)
	if err != nil {
		return err
	}
	p3g, _ := fixedDev.Profile("3g.40gb")
	gi, err := nv.CreateGPUInstance(ctx, fixedDev.UUID, p3g, gpu.Placement{Start: 4, Size: 4})
	if err != nil {
		return err
	}
	if _, err := nv.CreateComputeInstance(ctx, fixedDev.UUID, gi.GIID); err != nil {
		return err
	}
	status := v1alpha1.GPUNodeStatus{}
	for i, g := range srv.GPUs {
		d, err := nv.Device(ctx, g.UUID)
		if err != nil {
			return err
		}
		status.GPUs = append(status.GPUs, gpuStatus(i, d))
	}
	status.GPUs[0].Applied.MIGDynamic = &v1alpha1.DynamicMIGStatus{Profiles: []string{"3g.40gb"}}
	fixedDevice := ""
	for _, d := range dra.Devices(status, share.DefaultConfig()) {
		if d.Attributes[dra.AttrShare].StringValue != nil && *d.Attributes[dra.AttrShare].StringValue == "MIG" {
			fixedDevice = d.Name
		}
	}

	root, err := os.MkdirTemp("", "bench-dynmig")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(root) }()
	cfg := dra.PluginConfig{PluginDir: filepath.Join(root, "p"), RegistryDir: filepath.Join(root, "r"), CDIDir: filepath.Join(root, "cdi")}
	p, err := dra.NewKubeletPlugin(nodeName, cfg, share.DefaultConfig(), logr.Discard())
	if err != nil {
		return err
	}
	if p.MIG, err = dra.NewDynamicMIG(cfg.PluginDir, nv, logr.Discard()); err != nil {
		return err
	}
	p.Update(status)

	kinds := []struct{ name, device string }{{"dynamic 3g.40gb (create + prepare)", "gpu-0-mig-3g-40gb-4"}, {"fixed 3g.40gb (prepare)", fixedDevice}}
	prep := make([][]time.Duration, len(kinds))
	unprep := make([][]time.Duration, len(kinds))
	for i := 0; i < n; i++ {
		for k, kind := range kinds {
			c := claim(fmt.Sprintf("%d-%d", k, i), kind.device)
			t0 := time.Now()
			res, err := p.PrepareResourceClaims(ctx, []*resourcev1.ResourceClaim{c})
			if err == nil {
				err = res[c.UID].Err
			}
			if err != nil {
				return fmt.Errorf("%s: prepare: %w", kind.name, err)
			}
			prep[k] = append(prep[k], time.Since(t0))
			t0 = time.Now()
			ures, err := p.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, UID: c.UID}})
			if err == nil {
				err = ures[c.UID]
			}
			if err != nil {
				return fmt.Errorf("%s: unprepare: %w", kind.name, err)
			}
			unprep[k] = append(unprep[k], time.Since(t0))
		}
	}
	fmt.Printf("%d claims of each kind, alternating, on a mocked H100 (recorded geometry); the driver's create/destroy time is not in these figures\n", n)
	fmt.Printf("%-36s %10s %10s %10s   %10s %10s\n", "claim", "prep p50", "prep p95", "prep max", "unprep p50", "unprep p95")
	for k, kind := range kinds {
		fmt.Printf("%-36s %10s %10s %10s   %10s %10s\n", kind.name, pct(prep[k], 50), pct(prep[k], 95), pct(prep[k], 100), pct(unprep[k], 50), pct(unprep[k], 95))
	}
	fmt.Printf("reproduce: make bench-dynmig BENCH_ARGS=\"-claims %d\"\n", n)
	return nil
}

func claim(name, device string) *resourcev1.ResourceClaim {
	return &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "c-" + name, UID: types.UID("00000000-0000-4000-8000-" + fmt.Sprintf("%012s", name))},
		Status: resourcev1.ResourceClaimStatus{Allocation: &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{
			Results: []resourcev1.DeviceRequestAllocationResult{{Request: "gpu", Driver: dra.DriverName, Pool: nodeName, Device: device}}}}},
	}
}

// gpuStatus is the status the agent publishes for a MIG GPU d at index i.
func gpuStatus(i int, d gpu.Device) v1alpha1.GPUStatus {
	g := v1alpha1.GPUStatus{Index: int32(i), UUID: d.UUID, Product: d.Product, Memory: resource.NewQuantity(int64(d.MemoryBytes), resource.BinarySI),
		Applied: &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyMIG}, MIGProfiles: node.MIGProfiles(d.Profiles)}
	for _, in := range d.Instances {
		g.Applied.MIGInstances = append(g.Applied.MIGInstances, v1alpha1.MIGInstanceStatus{Profile: in.Profile, UUID: in.UUID,
			Placement: v1alpha1.MIGPlacement{Start: int32(in.Placement.Start), Size: int32(in.Placement.Size)}, GPUInstanceID: int32(in.GIID), ComputeInstanceID: int32(in.CIID)})
	}
	return g
}

func pct(d []time.Duration, p int) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := (len(s)*p + 99) / 100
	i = max(1, min(i, len(s)))
	return s[i-1].Round(time.Microsecond)
}
