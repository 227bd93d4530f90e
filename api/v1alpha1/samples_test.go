package v1alpha1_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpusharingv1alpha1 "github.com/gpusharing/gpusharing/api/v1alpha1"
)

func sampleFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(env.RepoRoot, "config", "samples", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no samples found under config/samples: %v", err)
	}
	return files
}

func TestServerAcceptsEverySample(t *testing.T) {
	ctx := context.Background()
	kinds := map[string]int{}
	for _, f := range sampleFiles(t) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		obj := &unstructured.Unstructured{}
		if err := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096).Decode(&obj.Object); err != nil {
			t.Fatalf("%s: %v", filepath.Base(f), err)
		}
		kinds[obj.GetKind()]++
		// A server-side dry run validates exactly as a create would, and leaves nothing behind for the
		// kubectl test below, which applies the same files.
		if err := env.Client.Create(ctx, obj, client.DryRunAll); err != nil {
			t.Errorf("%s rejected: %v", filepath.Base(f), err)
		}
	}
	if kinds["GPUSharingPolicy"] < 5 || kinds["GPUNode"] < 1 {
		t.Errorf("samples cover %v; want one policy per strategy, one with oversubscription and a GPUNode", kinds)
	}
}

func TestSamplesCoverEveryStrategyAndOversubscription(t *testing.T) {
	seen := map[gpusharingv1alpha1.Strategy]bool{}
	oversubscribed, sized, classed := false, false, false
	for _, f := range sampleFiles(t) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(data, []byte("kind: GPUSharingPolicy")) {
			continue
		}
		var p gpusharingv1alpha1.GPUSharingPolicy
		if err := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096).Decode(&p); err != nil {
			t.Fatalf("%s: %v", filepath.Base(f), err)
		}
		seen[p.Spec.Sharing.Strategy] = true
		oversubscribed = oversubscribed || p.Spec.Sharing.Oversubscription != nil
		sized = sized || p.Spec.Sharing.Sizing.PerClaim()
		classed = classed || p.Spec.Sharing.QoS != nil
	}
	if !sized {
		t.Error("no sample policy sizes shares per claim")
	}
	if !classed {
		t.Error("no sample policy sets production classes (qos)")
	}
	for _, s := range []gpusharingv1alpha1.Strategy{gpusharingv1alpha1.StrategyExclusive, gpusharingv1alpha1.StrategyTimeSlicing, gpusharingv1alpha1.StrategyMPS, gpusharingv1alpha1.StrategyMIG} {
		if !seen[s] {
			t.Errorf("no sample policy uses strategy %s", s)
		}
	}
	if !oversubscribed {
		t.Error("no sample policy turns on oversubscription")
	}
}

func kubectl(t *testing.T, kubeconfig string, args ...string) string {
	t.Helper()
	bin := filepath.Join(env.BinDir, "kubectl")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("kubectl not built in %s: run 'make control-plane': %v", env.BinDir, err)
	}
	cmd := exec.Command(bin, append([]string{"--kubeconfig", kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestKubectlGetGpusharingListsBothKindsWithTheirColumns(t *testing.T) {
	ctx := context.Background()
	kubeconfig, err := env.AdminKubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	kubectl(t, kubeconfig, "apply", "-f", filepath.Join(env.RepoRoot, "config", "samples")+"/")
	t.Cleanup(func() {
		kubectl(t, kubeconfig, "delete", "--wait=false", "-f", filepath.Join(env.RepoRoot, "config", "samples")+"/")
	})

	// Play the agent and the controller for one object each, so the columns have values to show.
	node := &gpusharingv1alpha1.GPUNode{}
	if err := env.Client.Get(ctx, types.NamespacedName{Name: "gpu-node-a1"}, node); err != nil {
		t.Fatal(err)
	}
	mem := resource.MustParse("80Gi")
	node.Status = gpusharingv1alpha1.GPUNodeStatus{
		DriverVersion: "580.159", CUDAVersion: "13.0", GPUCount: 2, AppliedGPUs: 1,
		Summary: "0:MIG(3g.40gb,1g.10gb×4) 1:MPS×4",
		GPUs: []gpusharingv1alpha1.GPUStatus{
			{UUID: "GPU-5e9d3b5c-8d2f-4b0e-9a1d-1f2e3d4c5b6a", Index: 0, Product: "NVIDIA H100 80GB HBM3", Memory: &mem},
			{UUID: "GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d", Index: 1, Product: "NVIDIA H100 80GB HBM3", Memory: &mem},
		},
		Conditions: []metav1.Condition{
			{Type: gpusharingv1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: gpusharingv1alpha1.ReasonInventoryPublished, LastTransitionTime: metav1.Now()},
			{Type: gpusharingv1alpha1.ConditionApplied, Status: metav1.ConditionFalse, Reason: gpusharingv1alpha1.ReasonGPUBusy, Message: "GPU 1: pids 4242 use the GPU", LastTransitionTime: metav1.Now()},
		},
	}
	if err := env.Client.Status().Update(ctx, node); err != nil {
		t.Fatal(err)
	}
	policy := &gpusharingv1alpha1.GPUSharingPolicy{}
	if err := env.Client.Get(ctx, types.NamespacedName{Name: "inference-mps"}, policy); err != nil {
		t.Fatal(err)
	}
	policy.Status = gpusharingv1alpha1.GPUSharingPolicyStatus{MatchedNodes: 1, MatchedGPUs: 3, ReadyGPUs: 2, Conditions: []metav1.Condition{
		{Type: gpusharingv1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: gpusharingv1alpha1.ReasonApplying, Message: "node gpu-node-a1 GPU 1: waiting for the agent", LastTransitionTime: metav1.Now()},
	}}
	if err := env.Client.Status().Update(ctx, policy); err != nil {
		t.Fatal(err)
	}

	out := kubectl(t, kubeconfig, "get", "gpusharing")
	t.Logf("kubectl get gpusharing:\n%s", out)
	for _, want := range []string{
		// Both kinds, through the shared category.
		"gpusharingpolicy.gpusharing.io/inference-mps", "gpusharingpolicy.gpusharing.io/mixed-mig",
		"gpusharingpolicy.gpusharing.io/training-exclusive", "gpunode.gpusharing.io/gpu-node-a1",
		// The policy columns.
		"STRATEGY", "PRIORITY", "NODES", "GPUS", "READY GPUS", "READY", "REASON",
		// The node columns.
		"APPLIED", "SHARING",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl get gpusharing does not show %q", want)
		}
	}
	if !rowHas(out, "inference-mps", "MPS", "10", "1", "3", "2", "False", "Applying") {
		t.Errorf("the inference-mps row does not show its strategy, priority, counts and Ready reason:\n%s", out)
	}
	if !rowHas(out, "gpu-node-a1", "2", "1", "0:MIG(3g.40gb,1g.10gb×4)", "True", "GPUBusy") {
		t.Errorf("the gpu-node-a1 row does not show its GPU counts, summary and reasons:\n%s", out)
	}

	wide := kubectl(t, kubeconfig, "get", "gpusharing", "-o", "wide")
	for _, want := range []string{"node gpu-node-a1 GPU 1: waiting for the agent", "GPU 1: pids 4242 use the GPU", "580.159"} {
		if !strings.Contains(wide, want) {
			t.Errorf("kubectl get gpusharing -o wide does not show %q:\n%s", want, wide)
		}
	}
	for _, short := range []string{"gsp", "gpun"} {
		kubectl(t, kubeconfig, "get", short)
	}
}

// rowHas reports whether the line that names obj holds every field, in order.
func rowHas(table, obj string, fields ...string) bool {
	for _, line := range strings.Split(table, "\n") {
		cols := strings.Fields(line)
		if len(cols) == 0 || !strings.HasSuffix(cols[0], "/"+obj) {
			continue
		}
		i := 1
		for _, f := range fields {
			for i < len(cols) && cols[i] != f {
				i++
			}
			if i == len(cols) {
				return false
			}
			i++
		}
		return true
	}
	return false
}
