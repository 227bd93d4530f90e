package chart

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/wait"
)

var (
	installOnce sync.Once
	// dryRun is what the API server makes of config/default's objects (defaults filled in), captured with
	// a server-side dry run before the chart is installed, so that nothing the chart did can leak into it.
	dryRun map[string]*unstructured.Unstructured
	// installed is what the chart created for each of those objects, read right after the install: the
	// upgrade tests change the live objects later in the same process (go test -count).
	installed map[string]*unstructured.Unstructured
)

// install captures config/default's objects as the API server would store them, then installs the chart
// with its defaults into the same API server, once for the package.
func install(t *testing.T) {
	t.Helper()
	installOnce.Do(func() {
		ctx := context.Background()
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
		if err := env.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		kc := kubeconfig(t)
		var items []any
		for _, u := range renderKustomize(t) {
			items = append(items, u.Object)
		}
		list, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(filepath.Join(env.BinDir, "kubectl"), "--kubeconfig", kc, "create", "--dry-run=server", "-o", "json", "-f", "-")
		cmd.Stdin = bytes.NewReader(list)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("server dry run of config/default: %v\n%s", err, stderr.String())
		}
		// kubectl prints one JSON object per created object.
		dryRun = decodeAll(t, string(out))
		run(t, "helm", "install", "gpusharing", chartDir(), "--kubeconfig", kc, "--namespace", namespace, "--wait=false")
		installed = map[string]*unstructured.Unstructured{}
		for k, want := range dryRun {
			switch want.GetKind() {
			case "Deployment", "DaemonSet", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
				"ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding", "ServiceAccount", "DeviceClass":
				installed[k] = live(t, want)
			}
		}
		// The tests create policies and GPUNodes next: wait until the chart's CRDs serve.
		wait.For(t, 60*time.Second, func() error { return env.Client.List(ctx, &v1.GPUNodeList{}) }, "the chart's CRDs serve")
	})
	if dryRun == nil {
		t.Fatal("the chart was not installed (see the first failure)")
	}
}

// live reads an object the chart created.
func live(t *testing.T, want *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(want.GroupVersionKind())
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(want), got); err != nil {
		t.Fatalf("the chart did not create %s: %v", key(want), err)
	}
	return got
}

func TestChartInstallsTheManagerAndAgentObjectsKustomizeApplies(t *testing.T) {
	install(t)
	compared := map[string]bool{}
	for k, want := range dryRun {
		var fields [][]string
		switch want.GetKind() {
		case "Deployment", "DaemonSet", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "DeviceClass":
			// A DeviceClass's spec carries extendedResourceName only where the API server's
			// DRAExtendedResource gate is on (1.36's default).
			fields = [][]string{{"spec"}}
		case "ClusterRole", "Role":
			fields = [][]string{{"rules"}}
		case "ClusterRoleBinding", "RoleBinding":
			fields = [][]string{{"roleRef"}, {"subjects"}}
		case "ServiceAccount":
			fields = nil
		default:
			continue
		}
		got := installed[k].DeepCopy()
		compared[want.GetKind()] = true
		// Helm labels what it manages; everything else must be kustomize's.
		labels := got.GetLabels()
		delete(labels, "app.kubernetes.io/managed-by")
		got.SetLabels(labels)
		fields = append(fields, []string{"metadata", "labels"})
		for _, f := range fields {
			w, _, _ := unstructured.NestedFieldNoCopy(want.Object, f...)
			g, _, _ := unstructured.NestedFieldNoCopy(got.Object, f...)
			w, g = normalize(t, w), normalize(t, g)
			if !reflect.DeepEqual(w, g) {
				t.Errorf("%s .%s differs:\n%s", k, strings.Join(f, "."), diff(w, g, ""))
			}
		}
	}
	for _, kind := range []string{"Deployment", "DaemonSet", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount", "ValidatingAdmissionPolicy", "DeviceClass"} {
		if !compared[kind] {
			t.Errorf("no %s was compared; config/default rendered %v", kind, keys(dryRun))
		}
	}
	// The API server kept the extended resource the class maps, so pods asking for it are served
	// through DRA.
	if dc := installed["DeviceClass//gpusharing-timeslicing"]; dc == nil {
		t.Error("the chart installed no DeviceClass gpusharing-timeslicing")
	} else if got, _, _ := unstructured.NestedString(dc.Object, "spec", "extendedResourceName"); got != "gpusharing.io/gpu-timeslice" {
		t.Errorf("DeviceClass gpusharing-timeslicing extendedResourceName %q, want gpusharing.io/gpu-timeslice", got)
	}
}

// asAgent is a client that the API server takes for the agent's service account with a token bound to
// a pod on node (the node-name claim, as the kubelet's projected token carries it); node "" has none.
func asAgent(t *testing.T, node string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + namespace + ":gpusharing-agent"}
	if node != "" {
		cfg.Impersonate.Extra = map[string][]string{"authentication.kubernetes.io/node-name": {node}}
	}
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func gpuNode(name string) *v1.GPUNode {
	return &v1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

func TestAdmissionPolicyKeepsEachAgentToItsOwnGPUNodeStatus(t *testing.T) {
	install(t)
	ctx := context.Background()
	sfx := runSuffix()
	nodeA, nodeB, nodeC, nodeD := "vap-node-a"+sfx, "vap-node-b"+sfx, "vap-node-c"+sfx, "vap-node-d"+sfx
	other := gpuNode(nodeB)
	if err := env.Client.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	agentA := asAgent(t, nodeA)
	forged := func() error {
		n := gpuNode(nodeB)
		if err := agentA.Get(ctx, client.ObjectKeyFromObject(n), n); err != nil {
			return err
		}
		n.Status.Summary = "0:Exclusive (forged by node a)"
		return agentA.Status().Update(ctx, n)
	}
	// The API server compiles a new policy asynchronously: wait until it refuses the forged write. Until
	// then RBAC alone allows it, which is exactly what this policy exists to prevent.
	var err error
	wait.UntilState(t, 60*time.Second, func() (bool, string) {
		err = forged()
		return err != nil, "the forged write was accepted"
	}, "the API server refuses node a's write of node b's status")
	if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
		t.Fatalf("agent of node %s wrote GPUNode %s's status: err %v, want a refusal", nodeA, nodeB, err)
	}
	if !strings.Contains(err.Error(), fmt.Sprintf("may write only GPUNode %s, not %s", nodeA, nodeB)) {
		t.Errorf("the refusal does not say why: %v", err)
	}

	// Its own GPUNode: the agent creates it with an empty spec and writes its status.
	own := gpuNode(nodeA)
	if err := agentA.Create(ctx, own); err != nil {
		t.Fatalf("agent could not create its own GPUNode: %v", err)
	}
	own.Status.Summary = "0:Exclusive"
	own.Status.ObservedGeneration = own.Generation
	if err := agentA.Status().Update(ctx, own); err != nil {
		t.Fatalf("agent could not write its own GPUNode's status: %v", err)
	}

	for _, tc := range []struct {
		name  string
		write func() error
		says  string
	}{
		{"writing its own GPUNode's spec", func() error {
			n := gpuNode(nodeA)
			if err := agentA.Get(ctx, client.ObjectKeyFromObject(n), n); err != nil {
				return err
			}
			n.Spec.GPUs = []v1.GPUDesired{{UUID: "GPU-1", Sharing: v1.Sharing{Strategy: v1.StrategyExclusive}}}
			return agentA.Update(ctx, n)
		}, `cannot update resource "gpunodes"`}, // RBAC first since the agent lost update: the policy is the second wall
		{"creating another node's GPUNode", func() error { return agentA.Create(ctx, gpuNode(nodeC)) }, "not " + nodeC},
		{"creating its own GPUNode with a spec", func() error {
			n := gpuNode(nodeD)
			n.Spec.GPUs = []v1.GPUDesired{{UUID: "GPU-1", Sharing: v1.Sharing{Strategy: v1.StrategyExclusive}}}
			return asAgent(t, nodeD).Create(ctx, n)
		}, "create it with an empty spec"},
		{"deleting its own GPUNode (RBAC grants no delete)", func() error { return agentA.Delete(ctx, gpuNode(nodeA)) }, "forbidden"},
		{"writing status with a token bound to no node", func() error {
			n := gpuNode(nodeA)
			c := asAgent(t, "")
			if err := c.Get(ctx, client.ObjectKeyFromObject(n), n); err != nil {
				return err
			}
			n.Status.Summary = "x"
			return c.Status().Update(ctx, n)
		}, "carries no node name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.write()
			if err == nil {
				t.Fatal("the API server allowed it")
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Errorf("refusal %q does not say %q", err, tc.says)
			}
		})
	}

	// Other users (the controller, admins) are not matched by the policy.
	n := gpuNode(nodeB)
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(n), n); err != nil {
		t.Fatal(err)
	}
	n.Spec.GPUs = []v1.GPUDesired{{UUID: "GPU-1", Sharing: v1.Sharing{Strategy: v1.StrategyExclusive}}}
	if err := env.Client.Update(ctx, n); err != nil {
		t.Errorf("an admin could not write a GPUNode's spec: %v", err)
	}
}

// A chart upgrade (new images) while a disruptive change is mid-rollout must leave every GPUNode and
// policy alone: the controller and agents are the only writers of those, and the chart owns neither.
// No kubelet runs here, so the new pods never start; what is checked is that the upgrade itself (CRDs
// re-applied, workloads and RBAC patched) changes no GPUNode's spec, no policy's spec or generation,
// and that the applied GPU still hashes as applied, which is what keeps an upgraded agent from
// re-applying or draining it.
func TestChartUpgradeWithAPolicyInFlightLeavesGPUNodesAlone(t *testing.T) {
	install(t)
	ctx := context.Background()
	p := &v1.GPUSharingPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "upgrade-mig" + runSuffix()},
		Spec:       v1.GPUSharingPolicySpec{Sharing: v1.Sharing{Strategy: v1.StrategyTimeSlicing, TimeSlicing: &v1.TimeSlicingSharing{Replicas: 4}}},
	}
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	applied := v1.Sharing{Strategy: v1.StrategyTimeSlicing, TimeSlicing: &v1.TimeSlicingSharing{Replicas: 4, Interval: v1.TimeSliceDefault}}
	draining := v1.Sharing{Strategy: v1.StrategyMIG, MIG: &v1.MIGSharing{Instances: []v1.MIGInstanceRequest{{Profile: "1g.10gb", Count: 7}}}}
	n := gpuNode("upgrade-node" + strings.TrimPrefix(p.Name, "upgrade-mig"))
	n.Spec.GPUs = []v1.GPUDesired{
		{UUID: "GPU-0", Index: 0, Policy: p.Name, PolicyGeneration: p.Generation, Sharing: applied},
		{UUID: "GPU-1", Index: 1, Policy: p.Name, PolicyGeneration: p.Generation, Sharing: draining},
	}
	if err := env.Client.Create(ctx, n); err != nil {
		t.Fatal(err)
	}
	n.Status = v1.GPUNodeStatus{ObservedGeneration: n.Generation, GPUs: []v1.GPUStatus{
		{UUID: "GPU-0", Index: 0, Applied: &v1.AppliedSharing{Strategy: v1.StrategyTimeSlicing, SpecHash: v1.SharingHash(applied)},
			Conditions: []metav1.Condition{{Type: v1.ConditionApplied, Status: metav1.ConditionTrue, Reason: v1.ReasonAsDesired, Message: "in force", LastTransitionTime: metav1.Now()}}},
		{UUID: "GPU-1", Index: 1, Applied: &v1.AppliedSharing{Strategy: v1.StrategyTimeSlicing},
			Drain:      &v1.GPUDrainStatus{Phase: v1.DrainPhaseDraining, Pods: []string{"default/train-0"}},
			Conditions: []metav1.Condition{{Type: v1.ConditionApplied, Status: metav1.ConditionFalse, Reason: v1.ReasonDraining, Message: "waiting", LastTransitionTime: metav1.Now()}}},
	}}
	if err := env.Client.Status().Update(ctx, n); err != nil {
		t.Fatal(err)
	}
	beforeNode, beforePolicy := n.DeepCopy(), p.DeepCopy()

	out := run(t, "helm", "upgrade", "gpusharing", chartDir(), "--kubeconfig", kubeconfig(t), "--namespace", namespace,
		"--set", "manager.image.tag=v0.2.0", "--set", "agent.image.tag=v0.2.0", "--wait=false")
	if !strings.Contains(out, "has been upgraded") {
		t.Fatalf("helm upgrade did not report an upgrade:\n%s", out)
	}
	ds := &unstructured.Unstructured{}
	ds.SetAPIVersion("apps/v1")
	ds.SetKind("DaemonSet")
	ds.SetNamespace(namespace)
	ds.SetName("gpusharing-agent")
	if got := fmt.Sprint(live(t, ds).Object["spec"]); !strings.Contains(got, "gpusharing/agent:v0.2.0") {
		t.Fatalf("the upgrade did not reach the agent DaemonSet: %s", got)
	}

	after := gpuNode(n.Name)
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(after), after); err != nil {
		t.Fatal(err)
	}
	if after.ResourceVersion != beforeNode.ResourceVersion || after.Generation != beforeNode.Generation ||
		!reflect.DeepEqual(after.Spec, beforeNode.Spec) {
		t.Errorf("the upgrade changed GPUNode %s: generation %d -> %d, resourceVersion %s -> %s", n.Name,
			beforeNode.Generation, after.Generation, beforeNode.ResourceVersion, after.ResourceVersion)
	}
	// What an upgraded agent reads: the applied GPU still hashes as applied (no re-apply), and the
	// draining GPU's spec is the same change (the drain goes on rather than restarting).
	if got := v1.SharingHash(after.Spec.GPUs[0].Sharing); got != after.Status.GPUs[0].Applied.SpecHash {
		t.Errorf("after the upgrade GPU 0 hashes %s but its status says %s applied: the agent would re-apply it", got, after.Status.GPUs[0].Applied.SpecHash)
	}
	if after.Status.GPUs[1].Drain == nil || after.Status.GPUs[1].Drain.Phase != v1.DrainPhaseDraining {
		t.Errorf("GPU 1's drain status changed: %+v", after.Status.GPUs[1].Drain)
	}
	afterPolicy := &v1.GPUSharingPolicy{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), afterPolicy); err != nil {
		t.Fatal(err)
	}
	if afterPolicy.Generation != beforePolicy.Generation || !reflect.DeepEqual(afterPolicy.Spec, beforePolicy.Spec) {
		t.Errorf("the upgrade changed policy %s: generation %d -> %d", p.Name, beforePolicy.Generation, afterPolicy.Generation)
	}
}

// normalize round-trips a decoded value through JSON, so numbers compare alike whether they came from
// kubectl's JSON (float64) or the typed client (int64).
func normalize(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}
