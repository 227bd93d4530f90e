package v1alpha1_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	apiextinternal "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apimachinery/pkg/runtime"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/testutil/agentsim"
	b "github.com/gpusharing/gpusharing/controllers/testutil/builders"
)

// BenchmarkGPUNodeWriteValidation times the CEL validation the API server runs on each GPUNode write of
// an 8-GPU node (the controller's spec patch and the agent's status update, a fleet's two most frequent
// writes): the CRD's rules as shipped and, side by side, with the pairwise uniqueness rule they replaced.
// go test ./api/v1alpha1 -run '^$' -bench GPUNodeWriteValidation
// Every field a rule reads copies the schema's property map in the API server (docs/controller.md, "CEL
// on every write"): the pairwise rule read 2n² fields, distinct() reads n.
func BenchmarkGPUNodeWriteValidation(b *testing.B) {
	const shipped = "self.map(g, g.uuid).distinct().size() == self.size()"
	for _, v := range []struct{ name, rule string }{
		{"shipped", shipped},
		{"pairwise", "self.all(g, self.exists_one(h, h.uuid == g.uuid))"},
	} {
		val, ss := gpuNodeValidator(b, shipped, v.rule)
		for _, w := range []string{"spec patch", "status update"} {
			obj, old := gpuNodeWrite(b, w, 8)
			if errs, _ := val.Validate(context.Background(), nil, ss, obj, old, celconfig.RuntimeCELCostBudget); len(errs) > 0 {
				b.Fatalf("%s, %s: %v", v.name, w, errs)
			}
			b.Run(w+"/"+v.name, func(b *testing.B) {
				for b.Loop() {
					val.Validate(context.Background(), nil, ss, obj, old, celconfig.RuntimeCELCostBudget)
				}
			})
		}
	}
}

// gpuNodeValidator compiles the GPUNode CRD's rules as the API server does, with the rule from replaced
// by to (both GPU lists carry it).
func gpuNodeValidator(t testing.TB, from, to string) (*cel.Validator, *schema.Structural) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "config", "crd", "bases", "gpusharing.io_gpunodes.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(raw), "rule: "+from); n != 2 {
		t.Fatalf("the CRD has %d GPU lists with the rule %q, want 2", n, from)
	}
	crd := &apiextv1.CustomResourceDefinition{}
	if err := yaml.Unmarshal([]byte(strings.ReplaceAll(string(raw), "rule: "+from, "rule: "+to)), crd); err != nil {
		t.Fatal(err)
	}
	in := &apiextinternal.JSONSchemaProps{}
	if err := apiextv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(crd.Spec.Versions[0].Schema.OpenAPIV3Schema, in, nil); err != nil {
		t.Fatal(err)
	}
	ss, err := schema.NewStructural(in)
	if err != nil {
		t.Fatal(err)
	}
	return cel.NewValidator(ss, true, celconfig.PerCallLimit), ss
}

// gpuNodeWrite is the object before and after the controller's first spec patch of a node with n GPUs
// (MPS on every GPU), or after the agent's status update that acks it.
func gpuNodeWrite(t testing.TB, write string, n int) (obj, old map[string]any) {
	t.Helper()
	gn := b.GPUNode("gpu-node-00000", b.WithGPUs(b.GPUs("gpu-node-00000", n, "NVIDIA H100 80GB HBM3")...))
	found := toUnstructured(t, gn)
	gn.Spec.GPUs = make([]v1.GPUDesired, n)
	for i := range gn.Spec.GPUs {
		gn.Spec.GPUs[i] = b.Desired(gn.Name, int32(i), "bench", 1, b.MPS(4, 25))
	}
	patched := toUnstructured(t, gn)
	if write == "spec patch" {
		return patched, found
	}
	agentsim.Apply(gn, nil)
	return toUnstructured(t, gn), patched
}

// toUnstructured is o as the API server holds it: JSON decoded into maps (int64 numbers).
func toUnstructured(t testing.TB, o runtime.Object) map[string]any {
	t.Helper()
	data, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := utiljson.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	return m
}
