package node

import (
	"testing"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

func TestProductionSummaryNamesEachGPUsProductionPods(t *testing.T) {
	qos := &v1alpha1.QoS{ProductionPriority: 1000}
	consumer := func(ns, pod string, c v1alpha1.WorkloadClass) v1alpha1.GPUConsumer {
		return v1alpha1.GPUConsumer{Namespace: ns, Pod: pod, Container: "main", Class: c}
	}
	gpu := func(i int32, q *v1alpha1.QoS, consumers []v1alpha1.GPUConsumer, clients ...v1alpha1.ShimClient) v1alpha1.GPUStatus {
		g := v1alpha1.GPUStatus{Index: i, UUID: "GPU-" + string(rune('a'+i)), Applied: &v1alpha1.AppliedSharing{QoS: q}}
		if consumers != nil {
			g.Usage = &v1alpha1.GPUUsage{Consumers: consumers}
		}
		if clients != nil {
			g.Applied.Shim = &v1alpha1.ShimStatus{Clients: clients}
		}
		return g
	}
	cases := []struct {
		name string
		gpus []v1alpha1.GPUStatus
		want string
	}{
		{"no GPU with production classes", []v1alpha1.GPUStatus{gpu(0, nil, []v1alpha1.GPUConsumer{consumer("a", "p", "")})}, ""},
		{"production and opportunistic pods on one GPU, in index order with one without classes",
			[]v1alpha1.GPUStatus{
				gpu(2, qos, []v1alpha1.GPUConsumer{consumer("serving", "web", v1alpha1.ClassProduction), consumer("batch", "train", v1alpha1.ClassOpportunistic)}),
				gpu(0, qos, nil),
				gpu(1, nil, []v1alpha1.GPUConsumer{consumer("x", "y", "")}),
			}, "0:- 2:serving/web"},
		{"a pod seen by the accounting and the shim is named once; a shim client's pod alone counts too",
			[]v1alpha1.GPUStatus{gpu(0, qos,
				[]v1alpha1.GPUConsumer{consumer("serving", "web", v1alpha1.ClassProduction), consumer("serving", "web", v1alpha1.ClassProduction)},
				v1alpha1.ShimClient{PID: 1, Pod: "serving/web", Class: v1alpha1.ClassProduction},
				v1alpha1.ShimClient{PID: 2, Pod: "serving/api", Class: v1alpha1.ClassProduction},
				v1alpha1.ShimClient{PID: 3, Pod: "batch/train", Class: v1alpha1.ClassOpportunistic},
				v1alpha1.ShimClient{PID: 4, Class: v1alpha1.ClassProduction})},
			"0:serving/api,serving/web"},
		{"more production pods than the summary names",
			[]v1alpha1.GPUStatus{gpu(0, qos, []v1alpha1.GPUConsumer{
				consumer("s", "a", v1alpha1.ClassProduction), consumer("s", "b", v1alpha1.ClassProduction),
				consumer("s", "c", v1alpha1.ClassProduction), consumer("s", "d", v1alpha1.ClassProduction),
				consumer("s", "e", v1alpha1.ClassProduction)})},
			"0:s/a,s/b,s/c,+2"},
	}
	for _, tc := range cases {
		if got := productionSummary(tc.gpus); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
