package main

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpusharing/gpusharing/agent/dra"
)

func TestParseDerivesHostPathsFromTheHostRoot(t *testing.T) {
	tests := []struct {
		name             string
		args             []string
		env              string
		node, mps, state string
		resync           time.Duration
		exclusiveProcess bool
	}{
		{"defaults", nil, "node-a", "node-a", "/run/gpusharing/mps", "/run/gpusharing/state", 30 * time.Second, false},
		{"host root moves every host path", []string{"--host-root=/var/lib/gs"}, "node-a", "node-a", "/var/lib/gs/mps", "/var/lib/gs/state", 30 * time.Second, false},
		{"explicit paths win", []string{"--host-root=/x", "--mps-root=/m", "--state-dir=/s", "--node-name=node-b", "--resync=5s", "--mps-exclusive-process"},
			"node-a", "node-b", "/m", "/s", 5 * time.Second, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("NODE_NAME", tt.env)
			o, _ := parse(tt.args)
			if o.nodeName != tt.node || o.mpsRoot != tt.mps || o.stateDir != tt.state || o.resync != tt.resync || o.mpsExclusiveProcess != tt.exclusiveProcess {
				t.Errorf("options = %+v", o)
			}
			if o.nvidiaSMI == "" || o.mpsControl == "" {
				t.Errorf("driver tools not resolved: %+v", o)
			}
		})
	}
}

// Each MPS GPU's /dev/shm tmpfs is capped by --mps-shm-size, 2Gi by default.
func TestMPSShmSizeFlag(t *testing.T) {
	t.Setenv("NODE_NAME", "node-a")
	if o, _ := parse(nil); o.mpsShmSize != 2<<30 {
		t.Errorf("default --mps-shm-size = %d, want 2Gi", o.mpsShmSize)
	}
	if o, _ := parse([]string{"--mps-shm-size=512Mi"}); o.mpsShmSize != 512<<20 {
		t.Errorf("--mps-shm-size=512Mi gives %d bytes", o.mpsShmSize)
	}
}

func TestDriverToolLooksUnderTheDriverRootFirst(t *testing.T) {
	root := t.TempDir()
	if got := driverTool(root, "no-such-tool-xyz"); got != root+"/usr/bin/no-such-tool-xyz" {
		t.Errorf("missing tool resolves to %q, want the conventional path under the driver root", got)
	}
	t.Setenv("PATH", "/bin:/usr/bin")
	if got := driverTool(root, "sh"); got != "/bin/sh" && got != "/usr/bin/sh" {
		t.Errorf("tool in $PATH resolves to %q", got)
	}
}

func TestParseTurnsTheDevicePluginOnWithItsFlags(t *testing.T) {
	t.Setenv("NODE_NAME", "node-a")
	o, _ := parse([]string{"--host-root=/h", "--device-plugin-dir=/dp", "--resource-exclusive=example.com/gpu", "--resource-mig-prefix=example.com/mig-",
		"--resource-timeslice=example.com/ts", "--resource-mps=example.com/mps", "--resource-shared=example.com/shared", "--pod-resources-socket=/pr.sock", "--drain-backoff=1m"})
	dp := o.devicePlugin
	if dp == nil {
		t.Fatal("device plugin off; want it on by default")
	}
	r := dp.Resources
	if dp.SocketDir != "/dp" || r.Exclusive != "example.com/gpu" || r.MIGPrefix != "example.com/mig-" || r.TimeSlicing != "example.com/ts" || r.MPS != "example.com/mps" || r.Shared != "example.com/shared" {
		t.Errorf("device plugin config = %+v", *dp)
	}
	if dp.SchedulerRoot != "/h/scheduler" || dp.MPSRoot != "" {
		t.Errorf("scheduler root %q, MPS root %q: want <host-root>/scheduler, and the MPS root left to app.Setup (--mps-root)", dp.SchedulerRoot, dp.MPSRoot)
	}
	if o.podResourcesSocket != "/pr.sock" || o.drainBackoff != time.Minute {
		t.Errorf("pod resources %q backoff %v", o.podResourcesSocket, o.drainBackoff)
	}
	if err := dp.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}

	o, _ = parse(nil)
	if o.devicePlugin == nil || o.devicePlugin.Resources.Exclusive != "nvidia.com/gpu" || o.devicePlugin.SocketDir != "/var/lib/kubelet/device-plugins" || o.podResourcesSocket != "/var/lib/kubelet/pod-resources/kubelet.sock" {
		t.Errorf("defaults: %+v %q", o.devicePlugin, o.podResourcesSocket)
	}
	if o, _ = parse([]string{"--device-plugin=false"}); o.devicePlugin != nil {
		t.Errorf("--device-plugin=false left the device plugin on")
	}
	if o.resourceSlices || o.draPlugin != nil {
		t.Errorf("DRA on by default: slices %v, kubelet plugin %+v", o.resourceSlices, o.draPlugin)
	}
}

// --dra publishes slices and serves the kubelet plugin, with or without the device plugin; the shares
// it prepares are cut and mounted as the device plugin's flags say even when the device plugin is off.
func TestParseTurnsDRAOnBesideOrInsteadOfTheDevicePlugin(t *testing.T) {
	t.Setenv("NODE_NAME", "node-a")
	o, _ := parse([]string{"--host-root=/h", "--dra", "--device-plugin=false", "--shim-library=/lib/gs.so", "--shim-replicas=3",
		"--dra-plugin-dir=/p", "--dra-registry-dir=/r", "--cdi-dir=/cdi"})
	if o.devicePlugin != nil || !o.resourceSlices || o.draPlugin == nil {
		t.Fatalf("--dra --device-plugin=false: device plugin %v, slices %v, kubelet plugin %v", o.devicePlugin != nil, o.resourceSlices, o.draPlugin != nil)
	}
	if *o.draPlugin != (dra.PluginConfig{PluginDir: "/p", RegistryDir: "/r", CDIDir: "/cdi"}) {
		t.Errorf("kubelet plugin config %+v", *o.draPlugin)
	}
	if o.shares.ShimLibrary != "/lib/gs.so" || o.shares.ShimReplicas != 3 || o.shares.SchedulerRoot != "/h/scheduler" {
		t.Errorf("shares %+v: want the shim flags and the scheduler root", o.shares)
	}
	o, _ = parse([]string{"--dra"})
	if o.devicePlugin == nil || o.draPlugin == nil || o.draPlugin.PluginDir != "/var/lib/kubelet/plugins/gpu.gpusharing.io" || o.draPlugin.CDIDir != "/var/run/cdi" {
		t.Errorf("--dra beside the device plugin: %v, %+v", o.devicePlugin != nil, o.draPlugin)
	}
	if o, _ = parse([]string{"--dra-resource-slices"}); !o.resourceSlices || o.draPlugin != nil {
		t.Errorf("--dra-resource-slices: slices %v, kubelet plugin %+v; want slices only", o.resourceSlices, o.draPlugin)
	}
}

// The shim schedulers run whether or not the device plugin does, under one root that the device plugin
// also names; the reserve defaults to 2Gi and takes a quantity.
func TestParseSetsTheSchedulerRootAndTheOversubscriptionReserve(t *testing.T) {
	t.Setenv("NODE_NAME", "node-a")
	o, _ := parse([]string{"--host-root=/h", "--device-plugin=false"})
	if o.schedulerRoot != "/h/scheduler" || o.oversubReserve != 2<<30 {
		t.Errorf("without the device plugin: scheduler root %q, reserve %d; want /h/scheduler and 2Gi", o.schedulerRoot, o.oversubReserve)
	}
	o, _ = parse([]string{"--scheduler-root=/s", "--oversub-reserve=3Gi"})
	if o.schedulerRoot != "/s" || o.devicePlugin.SchedulerRoot != "/s" || o.oversubReserve != 3<<30 {
		t.Errorf("scheduler root %q (device plugin %q), reserve %d; want /s for both and 3Gi", o.schedulerRoot, o.devicePlugin.SchedulerRoot, o.oversubReserve)
	}
}

// The context reserve charged to each process of a sized claim defaults to 768Mi, the MPS server's
// memory is an option too; both take quantities.
func TestParseSetsTheContextReserve(t *testing.T) {
	t.Setenv("NODE_NAME", "node-a")
	if o, _ := parse(nil); o.contextReserve != 768<<20 {
		t.Errorf("default context reserve %d, want 768Mi", o.contextReserve)
	}
	if o, _ := parse([]string{"--context-reserve=1Gi"}); o.contextReserve != 1<<30 {
		t.Errorf("--context-reserve=1Gi: %d", o.contextReserve)
	}
	if o, _ := parse([]string{"--mps-server-memory=100Mi"}); o.mpsServerMemory != 100<<20 {
		t.Errorf("--mps-server-memory=100Mi: %d", o.mpsServerMemory)
	}
}

// A memory flag refuses what it cannot use, with the reason; an unset optional one stays nil.
func TestQuantityFlagsRefuseWhatTheyCannotUse(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	shm := quantityFlag(fs, "shm", resource.NewQuantity(2<<30, resource.BinarySI), true, "shm")
	reserve := memoryFlag(fs, "reserve", 1<<20, "reserve")
	overhead := quantityFlag(fs, "overhead", nil, false, "overhead")
	for _, bad := range [][]string{{"--shm=0"}, {"--shm=-1Mi"}, {"--reserve=-1"}, {"--reserve=lots"}, {"--overhead=-5"}} {
		if err := fs.Parse(bad); err == nil || !strings.Contains(err.Error(), "quantity such as") {
			t.Errorf("%v: err = %v, want a refusal that says what a quantity looks like", bad, err)
		}
	}
	if err := fs.Parse([]string{"--reserve=0"}); err != nil || (*reserve).Value() != 0 {
		t.Errorf("--reserve=0: %v, %v", err, *reserve)
	}
	if (*shm).Value() != 2<<30 || *overhead != nil {
		t.Errorf("untouched flags: shm %v, overhead %v", *shm, *overhead)
	}
}
