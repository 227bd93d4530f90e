package chart

import (
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// networkPolicy.enabled renders config/network-policy's NetworkPolicies; by default the chart renders none
// (a policy that admits only a labelled namespace would cut off a Prometheus elsewhere).
func TestChartNetworkPolicyIsConfigNetworkPolicy(t *testing.T) {
	for k, u := range renderChart(t) {
		if u.GetKind() == "NetworkPolicy" {
			t.Errorf("the chart renders %s by default", k)
		}
	}
	k := renderKustomize(t, "network-policy")
	h := renderChart(t, "networkPolicy.enabled=true")
	for _, component := range []string{"manager", "agent"} {
		key := "NetworkPolicy/" + namespace + "/gpusharing-" + component
		if k[key] == nil || h[key] == nil {
			t.Fatalf("%s: kustomize renders %v, the chart %v", key, keys(k), keys(h))
		}
		if !reflect.DeepEqual(k[key].Object, h[key].Object) {
			t.Errorf("%s differs:\n%s", key, diff(k[key].Object, h[key].Object, ""))
		}
		ingress, _, _ := unstructured.NestedSlice(h[key].Object, "spec", "ingress")
		if len(ingress) != 1 {
			t.Fatalf("%s admits %d rules, want only the metrics scrape", key, len(ingress))
		}
		ports, _, _ := unstructured.NestedSlice(ingress[0].(map[string]any), "ports")
		if len(ports) != 1 || ports[0].(map[string]any)["port"] != "metrics" {
			t.Errorf("%s admits ports %v, want only metrics", key, ports)
		}
	}
	h = renderChart(t, "networkPolicy.enabled=true", "networkPolicy.metricsFrom[0].podSelector.matchLabels.app=prometheus")
	from, _, _ := unstructured.NestedSlice(h["NetworkPolicy/"+namespace+"/gpusharing-agent"].Object, "spec", "ingress")
	peers := from[0].(map[string]any)["from"].([]any)
	if len(peers) != 1 || !reflect.DeepEqual(peers[0], map[string]any{"podSelector": map[string]any{"matchLabels": map[string]any{"app": "prometheus"}}}) {
		t.Errorf("networkPolicy.metricsFrom did not reach the policy: %v", peers)
	}
}

// The ServiceMonitors scrape the endpoints as they serve: HTTPS with Prometheus's service account token,
// the self-signed certificate accepted unless metrics.serviceMonitor.tlsConfig says otherwise.
func TestChartServiceMonitorsScrapeHTTPSWithTheServiceAccountToken(t *testing.T) {
	endpoint := func(h map[string]*unstructured.Unstructured, component string) map[string]any {
		t.Helper()
		sm := h["ServiceMonitor/"+namespace+"/gpusharing-"+component]
		if sm == nil {
			t.Fatalf("no %s ServiceMonitor (the chart renders %v)", component, keys(h))
		}
		eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
		if len(eps) != 1 {
			t.Fatalf("%s ServiceMonitor endpoints %v, want one", component, eps)
		}
		return eps[0].(map[string]any)
	}
	h := renderChart(t, "metrics.serviceMonitor.enabled=true")
	for _, component := range []string{"manager", "agent"} {
		ep := endpoint(h, component)
		if ep["scheme"] != "https" || ep["bearerTokenFile"] != "/var/run/secrets/kubernetes.io/serviceaccount/token" {
			t.Errorf("%s endpoint %v: want scheme https with the service account token", component, ep)
		}
		if !reflect.DeepEqual(ep["tlsConfig"], map[string]any{"insecureSkipVerify": true}) {
			t.Errorf("%s endpoint tlsConfig %v: want the self-signed certificate accepted", component, ep["tlsConfig"])
		}
	}
	h = renderChart(t, "metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.tlsConfig.insecureSkipVerify=false",
		"metrics.serviceMonitor.tlsConfig.serverName=gpusharing-agent-metrics.gpusharing-system.svc")
	if tc := endpoint(h, "agent")["tlsConfig"]; !reflect.DeepEqual(tc, map[string]any{"insecureSkipVerify": false, "serverName": "gpusharing-agent-metrics.gpusharing-system.svc"}) {
		t.Errorf("metrics.serviceMonitor.tlsConfig did not reach the endpoint: %v", tc)
	}
}

// The ClusterRole gpusharing-metrics-reader is always rendered (config/default has it); metrics.readers
// binds it to the scrapers named.
func TestChartBindsTheMetricsReaderToMetricsReaders(t *testing.T) {
	const role, binding = "ClusterRole//gpusharing-metrics-reader", "ClusterRoleBinding//gpusharing-metrics-reader"
	h := renderChart(t)
	if h[role] == nil {
		t.Fatalf("no %s", role)
	}
	if h[binding] != nil {
		t.Errorf("%s rendered with no metrics.readers", binding)
	}
	h = renderChart(t, "metrics.readers[0].kind=ServiceAccount", "metrics.readers[0].name=prometheus-k8s", "metrics.readers[0].namespace=monitoring")
	b := h[binding]
	if b == nil {
		t.Fatalf("no %s with metrics.readers set", binding)
	}
	if ref, _, _ := unstructured.NestedString(b.Object, "roleRef", "name"); ref != "gpusharing-metrics-reader" {
		t.Errorf("%s binds %s", binding, ref)
	}
	subjects, _, _ := unstructured.NestedSlice(b.Object, "subjects")
	want := []any{map[string]any{"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}}
	if !reflect.DeepEqual(subjects, want) {
		t.Errorf("%s subjects %v, want %v", binding, subjects, want)
	}
}
