package gitops

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/cel-go/cel"
	"sigs.k8s.io/yaml"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/testenv"
)

// fluxExprs is config/flux/healthcheckexprs.yaml: entries of a Kustomization's spec.healthCheckExprs.
type fluxExprs struct {
	HealthCheckExprs []struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		InProgress string `json:"inProgress"`
		Failed     string `json:"failed"`
		Current    string `json:"current"`
	} `json:"healthCheckExprs"`
}

func readFluxExprs(t *testing.T) fluxExprs {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "flux", "healthcheckexprs.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var f fluxExprs
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		t.Fatal(err)
	}
	return f
}

// fluxStatus computes a custom resource's health as Flux's kustomize-controller documents it for
// healthCheckExprs: InProgress while status.observedGeneration differs from metadata.generation; then
// inProgress, failed and current in that order, the first that is true deciding; InProgress when none is.
// The object's top-level fields are the expressions' variables. An expression that cannot be evaluated
// (a field the object lacks) makes Flux retry until its timeout, which reads as InProgress; it is
// returned as an error so the test can tell the two apart.
func fluxStatus(inProgress, failed, current string, obj map[string]any) (string, error) {
	md, _ := obj["metadata"].(map[string]any)
	st, _ := obj["status"].(map[string]any)
	if og, ok := st["observedGeneration"]; ok && md != nil && fmt.Sprint(og) != fmt.Sprint(md["generation"]) {
		return "InProgress", nil
	}
	var decls []cel.EnvOption
	vars := map[string]any{}
	for _, name := range []string{"apiVersion", "kind", "metadata", "spec", "status"} {
		decls = append(decls, cel.Variable(name, cel.DynType))
		if v, ok := obj[name]; ok {
			vars[name] = v
		}
	}
	env, err := cel.NewEnv(decls...)
	if err != nil {
		return "", err
	}
	for _, e := range []struct{ expr, status string }{{inProgress, "InProgress"}, {failed, "Failed"}, {current, "Current"}} {
		if e.expr == "" {
			continue
		}
		ast, iss := env.Compile(e.expr)
		if iss.Err() != nil {
			return "", fmt.Errorf("%s: %w", e.status, iss.Err())
		}
		prg, err := env.Program(ast)
		if err != nil {
			return "", err
		}
		out, _, err := prg.Eval(vars)
		if err != nil {
			return "", fmt.Errorf("%s: %w", e.status, err)
		}
		b, ok := out.Value().(bool)
		if !ok {
			return "", fmt.Errorf("%s: the expression gave %v, want a bool", e.status, out.Value())
		}
		if b {
			return e.status, nil
		}
	}
	return "InProgress", nil
}

// fluxFor is the health Flux gives where Argo CD gives argo.
var fluxFor = map[string]string{"Healthy": "Current", "Progressing": "InProgress", "Degraded": "Failed"}

func gpuNodeExprs(t *testing.T) (inProgress, failed, current string) {
	t.Helper()
	for _, e := range readFluxExprs(t).HealthCheckExprs {
		if e.APIVersion == v1.GroupVersion.String() && e.Kind == "GPUNode" {
			return e.InProgress, e.Failed, e.Current
		}
	}
	t.Fatal("config/flux/healthcheckexprs.yaml has no entry for gpusharing.io/v1alpha1 GPUNode")
	return
}

// Every Argo CD test object of the GPUNode, objects of older agents among them, gets from Flux's
// expressions the health Argo CD's script gives it.
func TestFluxExpressionsReadEveryGPUNodeAsArgoCDDoes(t *testing.T) {
	inProgress, failed, current := gpuNodeExprs(t)
	data, err := os.ReadFile(filepath.Join(gpuNodeDir(), "health_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var tests healthTests
	if err := yaml.Unmarshal(data, &tests); err != nil {
		t.Fatal(err)
	}
	if len(tests.Tests) < 14 {
		t.Fatalf("health_test.yaml has %d tests, want the 14 or more it had when this test was written", len(tests.Tests))
	}
	for _, tc := range tests.Tests {
		obj := readObject(t, filepath.Join(gpuNodeDir(), tc.InputPath))
		got, err := fluxStatus(inProgress, failed, current, obj)
		want := fluxFor[tc.HealthStatus.Status]
		if err != nil {
			// Only an object without a status may leave an expression unevaluable (Flux then waits).
			if _, hasStatus := obj["status"]; hasStatus || want != "InProgress" {
				t.Errorf("%s: %v", tc.InputPath, err)
			}
			continue
		}
		if got != want {
			t.Errorf("%s: Flux reads %s, want %s (Argo CD reads %s)", tc.InputPath, got, want, tc.HealthStatus.Status)
		}
	}
}

// Every reason the API defines, on GPU 0's Applied=False of an older agent's GPUNode: Failed exactly for
// the permanent reasons, InProgress for the others.
func TestFluxExpressionsFailAnOlderAgentsGPUNodeExactlyForThePermanentReasons(t *testing.T) {
	inProgress, failed, current := gpuNodeExprs(t)
	for _, reason := range reasonConstants(t) {
		got, err := fluxStatus(inProgress, failed, current, olderAgentGPUNode(t, reason))
		if err != nil {
			t.Fatalf("%s: %v", reason, err)
		}
		want := "InProgress"
		if v1.IsHardwareRejection(reason) {
			want = "Failed"
		}
		if got != want {
			t.Errorf("GPU Applied=False %s without Stalled: Flux reads %s, want %s", reason, got, want)
		}
	}
}

func TestFluxExpressionsListExactlyTheAPIsPermanentReasons(t *testing.T) {
	_, failed, _ := gpuNodeExprs(t)
	list := regexp.MustCompile(`c\.reason in \[([^\]]*)\]`).FindStringSubmatch(failed)
	if list == nil {
		t.Fatalf("the failed expression has no \"c.reason in [...]\" list: %s", failed)
	}
	var got []string
	for _, s := range strings.Split(list[1], ",") {
		got = append(got, strings.Trim(strings.TrimSpace(s), "'"))
	}
	sort.Strings(got)
	if want := v1.HardwareRejectionReasons(); !slices.Equal(got, want) {
		t.Errorf("the failed expression's permanent reasons\n got %v\nwant %v (v1alpha1.HardwareRejectionReasons)", got, want)
	}
}
