package chart

import (
	"fmt"
	"path/filepath"
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/gpusharing/gpusharing/test/testenv"
)

// productionClasses.enabled renders config/qos-quota as kustomize does (the PriorityClass and the system
// grants, the latter in the release's namespace), plus a grant per granted namespace and a deny per
// tenant namespace.
func TestChartProductionClassesRenderTheQuotaRecipe(t *testing.T) {
	if h := renderChart(t); h["PriorityClass//gpusharing-production"] != nil {
		t.Fatal("the chart renders the production class by default")
	}
	h := renderChart(t, "productionClasses.enabled=true", "productionClasses.grantNamespaces={serving,api}",
		"productionClasses.grantPods=20", "productionClasses.denyNamespaces={tenant-a}")
	k := decodeAll(t, run(t, "kubectl", "kustomize", filepath.Join(testenv.RepoRoot(), "config", "qos-quota")))
	if len(k) == 0 {
		t.Fatal("kustomize renders nothing of config/qos-quota")
	}
	for key, want := range k {
		got := h[key]
		if got == nil {
			t.Errorf("the chart renders no %s (it renders %v)", key, keys(h))
			continue
		}
		if !reflect.DeepEqual(withoutLabels(got), withoutLabels(want)) {
			t.Errorf("%s differs from config/qos-quota:\nchart     %v\nkustomize %v", key, got.Object, want.Object)
		}
	}
	for _, ns := range []string{"serving", "api"} {
		q := h["ResourceQuota/"+ns+"/gpusharing-production"]
		if q == nil {
			t.Fatalf("no grant in %s (the chart renders %v)", ns, keys(h))
		}
		if pods, _, _ := unstructured.NestedString(q.Object, "spec", "hard", "pods"); pods != "20" {
			t.Errorf("the grant in %s allows %q pods, want 20 (productionClasses.grantPods)", ns, pods)
		}
	}
	deny := h["ResourceQuota/tenant-a/gpusharing-production-deny"]
	if deny == nil {
		t.Fatalf("no deny quota in tenant-a (the chart renders %v)", keys(h))
	}
	if pods, _, _ := unstructured.NestedString(deny.Object, "spec", "hard", "pods"); pods != "0" {
		t.Errorf("the deny quota allows %q pods, want 0", pods)
	}
	pc := renderChart(t, "productionClasses.enabled=true", "productionClasses.value=5000")["PriorityClass//gpusharing-production"]
	if pc == nil {
		t.Fatal("no production class")
	}
	if v, _, _ := unstructured.NestedFieldNoCopy(pc.Object, "value"); fmt.Sprint(v) != "5000" {
		t.Errorf("the production class's value is %v, want 5000 (productionClasses.value)", v)
	}
}

func withoutLabels(u *unstructured.Unstructured) map[string]any {
	c := u.DeepCopy()
	c.SetLabels(nil)
	return c.Object
}
