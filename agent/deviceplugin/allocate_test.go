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

// No shim share, of a GPU with production classes or not, production or opportunistic, gets an idle
// window from its environment: on a GPU with classes the scheduler tells production processes theirs
// (the device plugin cannot tell the classes apart), and a window set here would make every
// opportunistic process hand the GPU, and on an oversubscribed GPU its memory, to the next one whenever
// it paused on the CPU for a millisecond.
func TestShimSharesLeaveTheIdleWindowToTheScheduler(t *testing.T) {
	m := DevicesFromStatus(nodeStatus(
		gpu(0, "GPU-a", shimBudget(time.Second, "40Gi"), qos(1000)),
		gpu(1, "GPU-b", shimBudget(time.Second, "40Gi")),
	), Config{})
	for _, d := range m["gpusharing.io/gpu-shared"] {
		for _, opportunistic := range []bool{false, true} {
			d.Opportunistic = opportunistic
			resp, err := ContainerEdits(Config{}, []Device{d})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Envs[EnvShimSocket] == "" {
				t.Fatalf("%s: not a shim share: %v", d.ID, resp.Envs)
			}
			for _, env := range []string{EnvShimIdleMS, EnvShimIdleUS} {
				if got, set := resp.Envs[env]; set {
					t.Errorf("%s (opportunistic %v): %s=%q, want it left to the scheduler", d.ID, opportunistic, env, got)
				}
			}
		}
	}
}
