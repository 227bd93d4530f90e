package deviceplugin

import (
	"testing"
	"time"
)

// A sized shim share carries the shim's memory limit; several of one GPU in one container add up, and a
// fixed share (no limit) sets none, so a fixed-share container is unchanged.
func TestShimSharesCarryTheirMemoryLimitSummed(t *testing.T) {
	base := Device{Kind: KindShared, GPUUUID: "GPU-a", VisibleUUID: "GPU-a", Healthy: true}
	sized := func(limit int64) Device { d := base; d.Sized, d.MemoryLimitBytes = true, limit; return d }
	for _, tt := range []struct {
		name string
		devs []Device
		want string
	}{
		{"a fixed share", []Device{base}, ""},
		{"a sized share", []Device{sized(4 << 30)}, "4294967296"},
		{"two sized shares of one GPU", []Device{sized(4 << 30), sized(10 << 30)}, "15032385536"},
	} {
		resp, err := ContainerEdits(Config{}, tt.devs)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		got, set := resp.Envs[EnvShimMemoryLimit]
		if got != tt.want || set != (tt.want != "") {
			t.Errorf("%s: %s=%q (set %v), want %q", tt.name, EnvShimMemoryLimit, got, set, tt.want)
		}
		if resp.Envs[EnvLDPreload] != ContainerShimLibrary {
			t.Errorf("%s: LD_PRELOAD=%q, want the shim", tt.name, resp.Envs[EnvLDPreload])
		}
	}
}

// On a GPU with production classes every shim client of the device plugin releases the lock after 1 ms
// idle (production's gaps go to opportunistic work; production takes the GPU back at once; the plugin
// cannot tell production from opportunistic pods); a device the DRA plugin marked opportunistic, and
// every device elsewhere, keeps the shim's default.
func TestShimSharesOfAGPUWithProductionClassesReleaseWhenIdle(t *testing.T) {
	m := DevicesFromStatus(nodeStatus(
		gpu(0, "GPU-a", shimBudget(time.Second, "40Gi"), qos(1000)),
		gpu(1, "GPU-b", shimBudget(time.Second, "40Gi")),
	), Config{})
	for _, d := range m["gpusharing.io/gpu-shared"] {
		resp, err := ContainerEdits(Config{}, []Device{d})
		if err != nil {
			t.Fatal(err)
		}
		got, set := resp.Envs[EnvShimIdleMS]
		if want := d.GPUUUID == "GPU-a"; set != want || (want && got != ShimQoSIdleMS) {
			t.Errorf("%s: %s=%q (set %v); want it set to %s only on the GPU with qos", d.ID, EnvShimIdleMS, got, set, ShimQoSIdleMS)
		}
		d.Opportunistic = true
		if resp, err = ContainerEdits(Config{}, []Device{d}); err != nil {
			t.Fatal(err)
		}
		if got, set := resp.Envs[EnvShimIdleMS]; set {
			t.Errorf("%s, opportunistic: %s=%q, want the shim's default", d.ID, EnvShimIdleMS, got)
		}
	}
}
