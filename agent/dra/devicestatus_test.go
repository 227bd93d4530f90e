package dra_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr"
	resourcev1 "k8s.io/api/resource/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpusharing/gpusharing/agent/accounting"
	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/podpid"
)

const sizedGPU = "GPU-00000000-0000-0000-0000-00000000a100"

// snapshotOf is an accounting read of the sized GPU at at: each pod of "default" with its memory and SM use.
func snapshotOf(at time.Time, pods map[string][2]int64) accounting.Snapshot {
	g := accounting.GPU{UUID: sizedGPU, At: at, ProcessesRead: true, UtilizationRead: true}
	for name, use := range pods {
		g.Containers = append(g.Containers, accounting.Container{Ref: podpid.Ref{Namespace: "default", Name: name, Container: "main"},
			MemoryBytes: uint64(use[0]), MemoryComplete: true, SMPercent: float64(use[1]), SMKnown: true, SampledAt: at})
	}
	// A pod of another namespace with the same name counts for no claim of "default".
	g.Containers = append(g.Containers, accounting.Container{Ref: podpid.Ref{Namespace: "other", Name: "trainer", Container: "main"},
		MemoryBytes: 30 << 30, MemoryComplete: true, SMKnown: true, SMPercent: 90})
	return accounting.Snapshot{At: at, GPUs: []accounting.GPU{g}}
}

// deviceUsage reads the claim's status.devices: its one entry, which must name the allocated device and
// share, and the usage in it.
func deviceUsage(t *testing.T, claim *resourcev1.ResourceClaim) (dra.DeviceUsage, bool) {
	t.Helper()
	if len(claim.Status.Devices) == 0 {
		return dra.DeviceUsage{}, false
	}
	d := claim.Status.Devices[0]
	r := claim.Status.Allocation.Devices.Results[0]
	if len(claim.Status.Devices) != 1 || d.Driver != dra.DriverName || d.Pool != r.Pool || d.Device != r.Device ||
		d.ShareID == nil || r.ShareID == nil || *d.ShareID != string(*r.ShareID) || d.Data == nil {
		t.Fatalf("status.devices %+v, want one entry for the allocated share %+v", claim.Status.Devices, r)
	}
	var u dra.DeviceUsage
	if err := json.Unmarshal(d.Data.Raw, &u); err != nil {
		t.Fatalf("status.devices[0].data %s: %v", d.Data.Raw, err)
	}
	return u, true
}

func usageString(u dra.DeviceUsage) string {
	sm := "-"
	if u.SMPercent != nil && u.PeakSMPercent != nil {
		sm = fmt.Sprintf("%d/%d", *u.SMPercent, *u.PeakSMPercent)
	}
	return fmt.Sprintf("pods %v memory %dMi peak %dMi sm %s", u.Pods, u.MemoryBytes>>20, u.PeakMemoryBytes>>20, sm)
}

// A prepared sized claim shows what its pods hold and use, now and at peak, in its own device status.
// A move under the thresholds is not written within the interval, one past them is (after the least
// gap between two writes), and the pod gone shows as nothing held, the peak kept.
func TestAPreparedSizedClaimShowsItsPodsUseInItsDeviceStatus(t *testing.T) {
	ctx, env := draCluster(t)
	c := env.Client
	claim := sizedHeldClaim(t, ctx, c, "notebook", nodeName, "gpu-0-sized", "10Gi", "nb")
	dirs := newPluginDirs(t)
	p, err := dra.NewKubeletPlugin(nodeName, dirs.config(), dpConfig, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	p.Update(sizedMPSAndShimNode())
	kube := runPlugin(t, ctx, env, p)
	if err := prepareOne(ctx, p, claim); err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC))
	w := &dra.DeviceStatusWriter{Plugin: p, Kube: kube, Interval: time.Hour, Clock: clk, Log: logr.Discard()}
	read := func(what string, pods map[string][2]int64) (*resourcev1.ResourceClaim, dra.DeviceUsage, bool) {
		t.Helper()
		w.Write(context.Background(), snapshotOf(clk.Now(), pods))
		got := getClaim(t, ctx, c, "notebook")
		u, ok := deviceUsage(t, got)
		t.Logf("%s: %s", what, usageString(u))
		return got, u, ok
	}

	first, u, ok := read("3Gi, 40 %", map[string][2]int64{"nb": {3 << 30, 40}})
	if !ok || usageString(u) != "pods [nb] memory 3072Mi peak 3072Mi sm 40/40" || !u.SampledAt.Time.Equal(clk.Now()) {
		t.Fatalf("device status after the first read: %v %s at %v, want 3Gi and 40 %% of pod nb read at %v", ok, usageString(u), u.SampledAt, clk.Now())
	}

	clk.Step(dra.MinDeviceStatusGap)
	again, u, _ := read("a move under the thresholds", map[string][2]int64{"nb": {3<<30 + 100<<20, 45}})
	if again.ResourceVersion != first.ResourceVersion || usageString(u) != "pods [nb] memory 3072Mi peak 3072Mi sm 40/40" {
		t.Fatalf("a move of 100Mi and 5 points within the interval was written: %s (resourceVersion %s, was %s)", usageString(u), again.ResourceVersion, first.ResourceVersion)
	}

	clk.Step(time.Second)
	_, u, _ = read("a move past the thresholds", map[string][2]int64{"nb": {6 << 30, 80}})
	if usageString(u) != "pods [nb] memory 6144Mi peak 6144Mi sm 80/80" {
		t.Fatalf("a move to 6Gi and 80 %%: %s, want it written", usageString(u))
	}
	clk.Step(5 * time.Second)
	_, u, _ = read("another within the least gap", map[string][2]int64{"nb": {9 << 30, 80}})
	if usageString(u) != "pods [nb] memory 6144Mi peak 6144Mi sm 80/80" {
		t.Fatalf("a write within %v of the last: %s", dra.MinDeviceStatusGap, usageString(u))
	}
	clk.Step(dra.MinDeviceStatusGap)
	_, u, _ = read("the same past the gap", map[string][2]int64{"nb": {9 << 30, 80}})
	if usageString(u) != "pods [nb] memory 9216Mi peak 9216Mi sm 80/80" {
		t.Fatalf("a move to 9Gi past the gap: %s, want it written", usageString(u))
	}

	clk.Step(dra.MinDeviceStatusGap)
	_, u, _ = read("the pod gone", nil)
	if usageString(u) != "pods [nb] memory 0Mi peak 9216Mi sm 0/80" {
		t.Fatalf("after the pod's processes left: %s, want nothing held and the 9Gi peak kept", usageString(u))
	}

	clk.Step(time.Hour)
	last := getClaim(t, ctx, c, "notebook")
	_, u, _ = read("nothing moved for an hour", nil)
	if got := getClaim(t, ctx, c, "notebook"); got.ResourceVersion != last.ResourceVersion {
		t.Fatalf("a claim whose figures did not move was written again: %s", usageString(u))
	}
}
