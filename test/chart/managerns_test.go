package chart

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// manager.namespace moves the manager and everything of its own (service account, leader election Role
// and binding, metrics Service, ServiceMonitor, NetworkPolicy; its ClusterRoleBinding's subject) into a
// namespace the chart creates at Pod Security level restricted, while the agent stays in the release's
// namespace. The real API server's Pod Security admission admits the manager's pod there, and refuses
// the agent's.
func TestChartManagerNamespaceIsRestrictedAndAdmitsTheManager(t *testing.T) {
	ns := "gpusharing-manager" + runSuffix()
	h := renderChart(t, "manager.namespace="+ns, "networkPolicy.enabled=true", "metrics.serviceMonitor.enabled=true")
	nsObj := h["Namespace//"+ns]
	if nsObj == nil {
		t.Fatalf("no Namespace %s rendered", ns)
	}
	for _, mode := range []string{"enforce", "audit", "warn"} {
		if got := nsObj.GetLabels()["pod-security.kubernetes.io/"+mode]; got != "restricted" {
			t.Errorf("namespace label %s=%q, want restricted", mode, got)
		}
	}
	for _, k := range []string{"Deployment/%s/gpusharing-manager", "ServiceAccount/%s/gpusharing-manager", "Role/%s/gpusharing-leader-election",
		"RoleBinding/%s/gpusharing-leader-election", "Service/%s/gpusharing-manager-metrics", "ServiceMonitor/%s/gpusharing-manager", "NetworkPolicy/%s/gpusharing-manager"} {
		if h[strings.Replace(k, "%s", ns, 1)] == nil {
			t.Errorf("%s not rendered in the manager's namespace", strings.Replace(k, "%s", ns, 1))
		}
	}
	for _, k := range []string{"DaemonSet/%s/gpusharing-agent", "ServiceAccount/%s/gpusharing-agent", "Service/%s/gpusharing-agent-metrics"} {
		if h[strings.Replace(k, "%s", namespace, 1)] == nil {
			t.Errorf("%s not in the release's namespace", strings.Replace(k, "%s", namespace, 1))
		}
	}
	for _, crb := range []string{"manager", "agent"} {
		subjects, _, _ := unstructured.NestedSlice(h["ClusterRoleBinding//gpusharing-"+crb].Object, "subjects")
		want := map[string]string{"manager": ns, "agent": namespace}[crb]
		if len(subjects) != 1 || subjects[0].(map[string]any)["namespace"] != want {
			t.Errorf("ClusterRoleBinding gpusharing-%s subjects %v, want the service account in %s", crb, subjects, want)
		}
	}
	if h2 := renderChart(t); h2["Namespace//gpusharing-manager"] != nil || h2["Deployment/"+namespace+"/gpusharing-manager"] == nil {
		t.Error("by default the manager must stay in the release's namespace and no namespace be rendered")
	}

	// Pod Security admission on the real API server: create the namespace as rendered, then the pods of the
	// two workloads' templates (server dry run: admission runs, nothing is stored).
	ctx := context.Background()
	if err := env.Client.Create(ctx, nsObj.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, nsObj.DeepCopy()) })
	podOf := func(key string) *corev1.Pod {
		t.Helper()
		var ds struct {
			Spec struct {
				Template corev1.PodTemplateSpec `json:"template"`
			} `json:"spec"`
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(h[key].Object, &ds); err != nil {
			t.Fatal(err)
		}
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "psa-check", Namespace: ns}, Spec: ds.Spec.Template.Spec}
	}
	if err := env.Client.Create(ctx, podOf("Deployment/"+ns+"/gpusharing-manager"), client.DryRunAll); err != nil {
		t.Errorf("the manager's pod is refused in its restricted namespace: %v", err)
	}
	// The check has teeth: the agent's pod (less its RuntimeClass, which this API server lacks) is refused
	// there.
	agent := podOf("DaemonSet/" + namespace + "/gpusharing-agent")
	agent.Spec.RuntimeClassName = nil
	if err := env.Client.Create(ctx, agent, client.DryRunAll); err == nil || !strings.Contains(err.Error(), "restricted") {
		t.Errorf("the agent's pod in the restricted namespace: %v, want refused by Pod Security", err)
	}
}
