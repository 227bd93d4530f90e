package dra_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/test/prom"
)

const (
	sizedMPSGPU  = "GPU-00000000-0000-0000-0000-00000000a100"
	sizedShimGPU = "GPU-00000001-0000-0000-0000-00000000a100"
)

// sizedClaim is a claim allocated a share of the sized device of GPU index, as the kube-scheduler
// records it, reserved for pods.
func sizedClaim(name string, index int, memory, compute string, pods ...string) *resourcev1.ResourceClaim {
	c := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: name, UID: types.UID("uid-" + name)}}
	consumed := map[resourcev1.QualifiedName]resource.Quantity{dra.CapacityMemory: resource.MustParse(memory)}
	if compute != "" {
		consumed[dra.CapacityCompute] = resource.MustParse(compute)
	}
	c.Status.Allocation = &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{{
		Request: "gpu", Driver: dra.DriverName, Pool: nodeName, Device: fmt.Sprintf("gpu-%d-sized", index),
		ShareID: ptr(types.UID("share-" + name)), ConsumedCapacity: consumed,
	}}}}
	for _, p := range pods {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourcev1.ResourceClaimConsumerReference{Resource: "pods", Name: p, UID: types.UID("pod-" + p)})
	}
	return c
}

// sizedPlugin is a kubelet plugin told the sized node, its checkpoint in a temporary directory.
func sizedPlugin(t *testing.T) *dra.KubeletPlugin {
	t.Helper()
	p, err := dra.NewKubeletPlugin(nodeName, newPluginDirs(t).config(), dpConfig, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	p.Update(sizedMPSAndShimNode())
	return p
}

func prepare(t *testing.T, p *dra.KubeletPlugin, claims ...*resourcev1.ResourceClaim) {
	t.Helper()
	res, err := p.PrepareResourceClaims(context.Background(), claims)
	if err != nil {
		t.Fatal(err)
	}
	for uid, r := range res {
		if r.Err != nil {
			t.Fatalf("claim %s: %v", uid, r.Err)
		}
	}
}

func equalSeries(t *testing.T, got, want map[string]float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("got %d series, want %d:\n got %v\nwant %v", len(got), len(want), got, want)
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
}

// Each pod a prepared sized claim is reserved for exports the claim's memory and compute on its GPU,
// and the series leave when the kubelet unprepares the claim.
func TestClaimSeriesFollowThePreparedClaims(t *testing.T) {
	p := sizedPlugin(t)
	reg := prometheus.NewRegistry()
	m, err := dra.NewClaimMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.Add(nodeName, p)
	prepare(t, p, sizedClaim("train", 0, "10Gi", "30", "train-0"),
		sizedClaim("shared", 1, "6Gi", "20", "serve-a", "serve-b"))

	equalSeries(t, prom.Gathered(t, reg, "claim"), map[string]float64{
		"gpusharing_pod_claim_memory_bytes{ml/train-0,train," + sizedMPSGPU + "," + nodeName + "}":      10 << 30,
		"gpusharing_pod_claim_compute_percent{ml/train-0,train," + sizedMPSGPU + "," + nodeName + "}":   30,
		"gpusharing_pod_claim_memory_bytes{ml/serve-a,shared," + sizedShimGPU + "," + nodeName + "}":    6 << 30,
		"gpusharing_pod_claim_compute_percent{ml/serve-a,shared," + sizedShimGPU + "," + nodeName + "}": 20,
		"gpusharing_pod_claim_memory_bytes{ml/serve-b,shared," + sizedShimGPU + "," + nodeName + "}":    6 << 30,
		"gpusharing_pod_claim_compute_percent{ml/serve-b,shared," + sizedShimGPU + "," + nodeName + "}": 20,
	})

	res, err := p.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: "uid-shared"}})
	if err != nil || res["uid-shared"] != nil {
		t.Fatalf("unprepare: %v %v", err, res)
	}
	equalSeries(t, prom.Gathered(t, reg, "claim"), map[string]float64{
		"gpusharing_pod_claim_memory_bytes{ml/train-0,train," + sizedMPSGPU + "," + nodeName + "}":    10 << 30,
		"gpusharing_pod_claim_compute_percent{ml/train-0,train," + sizedMPSGPU + "," + nodeName + "}": 30,
	})
}

// A GPU with more claimed pods than the cap exports the largest claims and counts the rest.
func TestClaimSeriesAreCappedPerGPU(t *testing.T) {
	p := sizedPlugin(t)
	reg := prometheus.NewRegistry()
	m, err := dra.NewClaimMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.MaxSeriesPerGPU = 2
	m.Add(nodeName, p)
	prepare(t, p, sizedClaim("big", 0, "20Gi", "50", "big-0"), sizedClaim("mid", 0, "10Gi", "30", "mid-0"),
		sizedClaim("small", 0, "2Gi", "10", "small-0"), sizedClaim("other", 1, "1Gi", "", "other-0"))

	equalSeries(t, prom.Gathered(t, reg, "claim"), map[string]float64{
		"gpusharing_pod_claim_memory_bytes{ml/big-0,big," + sizedMPSGPU + "," + nodeName + "}":         20 << 30,
		"gpusharing_pod_claim_compute_percent{ml/big-0,big," + sizedMPSGPU + "," + nodeName + "}":      50,
		"gpusharing_pod_claim_memory_bytes{ml/mid-0,mid," + sizedMPSGPU + "," + nodeName + "}":         10 << 30,
		"gpusharing_pod_claim_compute_percent{ml/mid-0,mid," + sizedMPSGPU + "," + nodeName + "}":      30,
		"gpusharing_pod_claim_series_omitted{/,," + sizedMPSGPU + "," + nodeName + "}":                 1,
		"gpusharing_pod_claim_memory_bytes{ml/other-0,other," + sizedShimGPU + "," + nodeName + "}":    1 << 30,
		"gpusharing_pod_claim_compute_percent{ml/other-0,other," + sizedShimGPU + "," + nodeName + "}": 0,
	})
}
