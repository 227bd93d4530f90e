package chart

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/gpusharing/gpusharing/test/testenv"
)

// decodeAll splits a multi-document YAML stream into objects keyed "Kind/namespace/name".
func decodeAll(t *testing.T, stream string) map[string]*unstructured.Unstructured {
	t.Helper()
	out := map[string]*unstructured.Unstructured{}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewBufferString(stream), 4096)
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("decoding rendered YAML: %v", err)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		out[key(u)] = u
	}
	return out
}

func key(u *unstructured.Unstructured) string {
	return fmt.Sprintf("%s/%s/%s", u.GetKind(), u.GetNamespace(), u.GetName())
}

func keys(m map[string]*unstructured.Unstructured) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// renderKustomize is `kubectl kustomize config/<dir>` (config/default where dir is empty) without the
// Namespace, which the chart leaves to `helm install --create-namespace` (docs/deploy.md says how to label
// it).
func renderKustomize(t *testing.T, dir ...string) map[string]*unstructured.Unstructured {
	t.Helper()
	d := "default"
	if len(dir) > 0 {
		d = dir[0]
	}
	out := run(t, "kubectl", "kustomize", filepath.Join(testenv.RepoRoot(), "config", d))
	objs := decodeAll(t, out)
	delete(objs, "Namespace//"+namespace)
	// kustomize's namespace transformer does not know that admission policies are cluster-scoped and
	// stamps them with the namespace, which the API server ignores; key them as the chart renders them.
	for k, u := range objs {
		if u.GetKind() == "ValidatingAdmissionPolicy" || u.GetKind() == "ValidatingAdmissionPolicyBinding" {
			delete(objs, k)
			u.SetNamespace("")
			objs[key(u)] = u
		}
	}
	return objs
}

// kubeVersion is the Kubernetes version the chart renders for unless a test says otherwise: the one the
// envtest API server runs. (helm template's own default is far older.)
const kubeVersion = "1.36.3"

// renderChart is `helm template` for Kubernetes kubeVersion with the defaults (and extra --set flags)
// into gpusharing-system.
func renderChart(t *testing.T, set ...string) map[string]*unstructured.Unstructured {
	t.Helper()
	return renderChartFor(t, kubeVersion, set...)
}

// renderChartFor is renderChart for another Kubernetes version.
func renderChartFor(t *testing.T, version string, set ...string) map[string]*unstructured.Unstructured {
	t.Helper()
	args := []string{"template", "gpusharing", chartDir(), "--namespace", namespace, "--kube-version", version}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return decodeAll(t, run(t, "helm", args...))
}

func TestHelmLintPasses(t *testing.T) {
	for _, set := range [][]string{nil, {"metrics.serviceMonitor.enabled=true", "grafana.dashboard.enabled=true", "admissionPolicy.enabled=false"}} {
		args := []string{"lint", "--strict", chartDir()}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		run(t, "helm", args...)
	}
}

func TestChartWithDefaultsRendersExactlyWhatKustomizeRenders(t *testing.T) {
	sameObjects(t, renderKustomize(t), renderChart(t))
}

// Before Kubernetes 1.36 the chart's Auto interface is Both: the device plugin beside DRA, with
// DeviceClasses that name no extended resource, which is what config/deviceplugin renders; on 1.36 the
// same comes from agent.deviceInterface=Both.
func TestChartBefore136RendersWhatConfigDevicepluginRenders(t *testing.T) {
	k := renderKustomize(t, "deviceplugin")
	t.Run("Auto on 1.35", func(t *testing.T) { sameObjects(t, k, renderChartFor(t, "1.35.0")) })
	t.Run("Both on 1.36", func(t *testing.T) {
		// On 1.36 the chart also renders right-sizing's MutatingAdmissionPolicy (GA there), which
		// config/deviceplugin, for the clusters before it, leaves out.
		h := renderChart(t, "agent.deviceInterface=Both")
		for key, u := range h {
			if strings.HasPrefix(u.GetKind(), "MutatingAdmissionPolicy") {
				delete(h, key)
			}
		}
		sameObjects(t, k, h)
	})
}

// sameObjects fails unless kustomize and the chart render the same objects, the CRDs' keep annotation
// (the chart's) aside.
func sameObjects(t *testing.T, k, h map[string]*unstructured.Unstructured) {
	t.Helper()
	for _, u := range h {
		// The one intended difference: helm keeps the CRDs (and so every policy) on uninstall.
		if u.GetKind() == "CustomResourceDefinition" {
			a := u.GetAnnotations()
			if a["helm.sh/resource-policy"] != "keep" {
				t.Errorf("%s lacks helm.sh/resource-policy: keep", key(u))
			}
			delete(a, "helm.sh/resource-policy")
			if len(a) == 0 {
				a = nil
			}
			u.SetAnnotations(a)
		}
	}
	if kk, hk := keys(k), keys(h); !reflect.DeepEqual(kk, hk) {
		t.Fatalf("kustomize renders %v,\nthe chart renders %v", kk, hk)
	}
	for name, want := range k {
		if got := h[name]; !reflect.DeepEqual(want.Object, got.Object) {
			t.Errorf("%s differs:\n%s", name, diff(want.Object, got.Object, ""))
		}
	}
}

// diff names the paths where two decoded objects differ.
func diff(a, b any, path string) string {
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if aok && bok {
		var out []string
		seen := map[string]bool{}
		for k := range am {
			seen[k] = true
		}
		for k := range bm {
			seen[k] = true
		}
		var ks []string
		for k := range seen {
			ks = append(ks, k)
		}
		sort.Strings(ks)
		for _, k := range ks {
			if d := diff(am[k], bm[k], path+"."+k); d != "" {
				out = append(out, d)
			}
		}
		return strings.Join(out, "\n")
	}
	if reflect.DeepEqual(a, b) {
		return ""
	}
	return fmt.Sprintf("  %s: kustomize %v, chart %v", path, a, b)
}

func TestChartValuesReachTheObjects(t *testing.T) {
	h := renderChart(t,
		"agent.image.tag=v9", "agent.nodeSelector.pool=a100", "agent.oversubReserve=4Gi", "agent.mpsShmSize=512Mi",
		"agent.resourceNames.mps=example.com/mps", "agent.healthChecks.enabled=false",
		"agent.healthChecks.ignoredXids=13\\,31", "manager.replicas=1",
		"metrics.serviceMonitor.enabled=true", "grafana.dashboard.enabled=true",
	)
	ds := h["DaemonSet/"+namespace+"/gpusharing-agent"]
	if ds == nil {
		t.Fatal("no agent DaemonSet")
	}
	c, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	agent := c[0].(map[string]any)
	if agent["image"] != "gpusharing/agent:v9" {
		t.Errorf("agent image %v, want gpusharing/agent:v9", agent["image"])
	}
	args := fmt.Sprint(agent["args"])
	for _, want := range []string{"--oversub-reserve=4Gi", "--mps-shm-size=512Mi", "--resource-mps=example.com/mps", "--health-checks=false", "--health-ignored-xids=13,31"} {
		if !strings.Contains(args, want) {
			t.Errorf("agent args %s lack %s", args, want)
		}
	}
	if !strings.Contains(args, "--dra ") || !strings.Contains(args, "--device-plugin=false") {
		t.Errorf("agent args %s: on Kubernetes 1.36 the default is DRA without the device plugin", args)
	}
	if sel, _, _ := unstructured.NestedStringMap(ds.Object, "spec", "template", "spec", "nodeSelector"); sel["pool"] != "a100" {
		t.Errorf("agent nodeSelector %v lacks pool=a100", sel)
	}
	if r, _, _ := unstructured.NestedFieldNoCopy(h["Deployment/"+namespace+"/gpusharing-manager"].Object, "spec", "replicas"); fmt.Sprint(r) != "1" {
		t.Errorf("manager replicas %v, want 1", r)
	}
	for _, want := range []string{"ServiceMonitor/" + namespace + "/gpusharing-agent", "ServiceMonitor/" + namespace + "/gpusharing-manager",
		"Service/" + namespace + "/gpusharing-agent-metrics", "ConfigMap/" + namespace + "/gpusharing-dashboard"} {
		if h[want] == nil {
			t.Errorf("the chart with serviceMonitor and dashboard on renders no %s (it renders %v)", want, keys(h))
		}
	}
}

// agent.deviceInterface=DRA turns the device plugin off and DRA on, with the kubelet's plugin
// directories and the CDI directory mounted at their host paths (the kubelet dials the socket there, the
// runtime reads the specs there).
func TestChartDeviceInterfaceDRAServesClaimsInsteadOfExtendedResources(t *testing.T) {
	h := renderChart(t, "agent.deviceInterface=DRA", "agent.cdiDir=/etc/cdi")
	spec, _, _ := unstructured.NestedMap(h["DaemonSet/"+namespace+"/gpusharing-agent"].Object, "spec", "template", "spec")
	agent := spec["containers"].([]any)[0].(map[string]any)
	args := fmt.Sprint(agent["args"])
	for _, want := range []string{"--device-plugin=false", "--dra ", "--dra-plugin-dir=/var/lib/kubelet/plugins/gpu.gpusharing.io", "--dra-registry-dir=/var/lib/kubelet/plugins_registry", "--cdi-dir=/etc/cdi"} {
		if !strings.Contains(args, want) {
			t.Errorf("agent args %s lack %q", args, want)
		}
	}
	hostPath := map[string]string{}
	for _, v := range spec["volumes"].([]any) {
		v := v.(map[string]any)
		if hp, ok := v["hostPath"].(map[string]any); ok {
			hostPath[v["name"].(string)] = hp["path"].(string)
		}
	}
	mounted := map[string]bool{}
	for _, m := range agent["volumeMounts"].([]any) {
		m := m.(map[string]any)
		if hostPath[m["name"].(string)] == m["mountPath"] {
			mounted[m["mountPath"].(string)] = true
		}
	}
	for _, p := range []string{"/var/lib/kubelet/plugins/gpu.gpusharing.io", "/var/lib/kubelet/plugins_registry", "/etc/cdi"} {
		if !mounted[p] {
			t.Errorf("%s is not a hostPath mounted at its host path (mounts %v)", p, agent["volumeMounts"])
		}
	}
	both := fmt.Sprint(renderChart(t, "agent.deviceInterface=Both")["DaemonSet/"+namespace+"/gpusharing-agent"].Object)
	if !strings.Contains(both, "--dra ") || strings.Contains(both, "--device-plugin=false") {
		t.Errorf("Both: want --dra beside the device plugin")
	}
	if out, err := tool(t, "helm", "", "template", "gpusharing", chartDir(), "--set", "agent.deviceInterface=Dra"); err == nil || !strings.Contains(string(out), "want Auto, DevicePlugin, DRA or Both") {
		t.Errorf("an unknown deviceInterface rendered (%v): %s", err, out)
	}
}

// The agent's DRA rights (ResourceSlices, ResourceClaims) come with DRA only: the chart renders their
// role where agent.deviceInterface serves DRA, as config/dra renders it beside config/default, and none
// with the device plugin alone.
func TestChartGrantsTheAgentDRARightsOnlyWhereItServesDRA(t *testing.T) {
	const role, binding = "ClusterRole//gpusharing-agent-dra", "ClusterRoleBinding//gpusharing-agent-dra"
	h := renderChart(t, "agent.deviceInterface=DevicePlugin")
	for _, k := range []string{role, binding} {
		if h[k] != nil {
			t.Errorf("agent.deviceInterface=DevicePlugin renders %s", k)
		}
	}
	for _, u := range h {
		if strings.Contains(fmt.Sprint(u.Object["rules"]), "resourceslices") {
			t.Errorf("agent.deviceInterface=DevicePlugin renders %s granting resourceslices", key(u))
		}
	}
	k := decodeAll(t, run(t, "kubectl", "kustomize", filepath.Join(testenv.RepoRoot(), "config", "dra")))
	for _, mode := range []string{"DRA", "Both"} {
		h := renderChart(t, "agent.deviceInterface="+mode)
		for _, name := range []string{role, binding} {
			want, got := k[name], h[name]
			if want == nil || got == nil {
				t.Fatalf("agent.deviceInterface=%s: config/dra renders %s: %v, the chart: %v", mode, name, want != nil, got != nil)
			}
			if !reflect.DeepEqual(want.Object, got.Object) {
				t.Errorf("agent.deviceInterface=%s: %s differs:\n%s", mode, name, diff(want.Object, got.Object, ""))
			}
		}
	}
}

// runtimeClass.create renders config/runtimeclass's RuntimeClass under agent.runtimeClassName; by default
// the chart leaves the RuntimeClass to the GPU Operator or whoever set up the NVIDIA runtime.
func TestChartRuntimeClassIsConfigRuntimeclass(t *testing.T) {
	const key = "RuntimeClass//nvidia"
	if rc := renderChart(t)[key]; rc != nil {
		t.Errorf("the chart renders %s by default", key)
	}
	k := renderKustomize(t, "runtimeclass")
	h := renderChart(t, "runtimeClass.create=true")
	if !reflect.DeepEqual(k[key].Object, h[key].Object) {
		t.Errorf("%s differs:\n%s", key, diff(k[key].Object, h[key].Object, ""))
	}
}
