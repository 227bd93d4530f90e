package gitops

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"

	lua "github.com/yuin/gopher-lua"
	"sigs.k8s.io/yaml"

	"github.com/gpusharing/gpusharing/test/testenv"
)

// healthTests is Argo CD's health_test.yaml: each input object and the health it must get.
type healthTests struct {
	Tests []struct {
		HealthStatus struct {
			Status  string `json:"status"`
			Message string `json:"message"`
		} `json:"healthStatus"`
		InputPath string `json:"inputPath"`
	} `json:"tests"`
}

// argoHealth is what Argo CD accepts as a health status.
var argoHealth = map[string]bool{"Healthy": true, "Progressing": true, "Degraded": true, "Suspended": true, "Missing": true, "Unknown": true}

// customizationDirs lists config/argocd/<group>/<Kind>, as Argo CD lays out resource_customizations.
func customizationDirs(t *testing.T) []string {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join(testenv.RepoRoot(), "config", "argocd", "*", "*"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range dirs {
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			out = append(out, d)
		}
	}
	sort.Strings(out)
	return out
}

// runHealth runs a health.lua the way Argo CD's lua VM does (util/lua in argo-cd): a state without the
// standard libraries except package, base and table, the object's JSON as the global table obj, and the
// returned table read as {status, message}.
func runHealth(script string, obj map[string]any) (status, message string, err error) {
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	for _, lib := range []struct {
		name string
		fn   lua.LGFunction
	}{{lua.LoadLibName, lua.OpenPackage}, {lua.BaseLibName, lua.OpenBase}, {lua.TabLibName, lua.OpenTable}} {
		l.Push(l.NewFunction(lib.fn))
		l.Push(lua.LString(lib.name))
		l.Call(1, 0)
	}
	l.SetGlobal("obj", toLua(l, obj))
	if err := l.DoString(script); err != nil {
		return "", "", err
	}
	ret, ok := l.Get(-1).(*lua.LTable)
	if !ok {
		return "", "", fmt.Errorf("the script returned %s, want a table", l.Get(-1).Type())
	}
	st, ok1 := ret.RawGetString("status").(lua.LString)
	msg, ok2 := ret.RawGetString("message").(lua.LString)
	if !ok1 || !ok2 {
		return "", "", fmt.Errorf("the script returned status %v and message %v, want two strings", ret.RawGetString("status"), ret.RawGetString("message"))
	}
	return string(st), string(msg), nil
}

// toLua is Argo CD's decodeValue: maps become tables with string keys, slices 1-based arrays.
func toLua(l *lua.LState, v any) lua.LValue {
	switch v := v.(type) {
	case map[string]any:
		t := l.NewTable()
		for k, e := range v {
			t.RawSetString(k, toLua(l, e))
		}
		return t
	case []any:
		t := l.NewTable()
		for _, e := range v {
			t.Append(toLua(l, e))
		}
		return t
	case string:
		return lua.LString(v)
	case bool:
		return lua.LBool(v)
	case float64:
		return lua.LNumber(v)
	case int64:
		return lua.LNumber(v)
	case nil:
		return lua.LNil
	}
	panic(fmt.Sprintf("toLua: unexpected %T", v))
}

// readObject reads a testdata YAML into the map Argo CD hands the script (JSON numbers as float64).
func readObject(t *testing.T, path string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var obj map[string]any
	if err := json.Unmarshal(j, &obj); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return obj
}

func TestArgoCDHealthChecksGiveTheExpectedStatusAndMessageInEveryPhase(t *testing.T) {
	dirs := customizationDirs(t)
	if len(dirs) != 2 {
		t.Fatalf("found %d health checks under config/argocd (%v), want GPUSharingPolicy and GPUNode", len(dirs), dirs)
	}
	for _, dir := range dirs {
		kind := filepath.Base(dir)
		t.Run(kind, func(t *testing.T) {
			script, err := os.ReadFile(filepath.Join(dir, "health.lua"))
			if err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(filepath.Join(dir, "health_test.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			var tests healthTests
			if err := yaml.UnmarshalStrict(data, &tests); err != nil {
				t.Fatalf("health_test.yaml: %v", err)
			}
			// Every testdata object is listed, so no phase is written down but never checked.
			listed := map[string]bool{}
			for _, tt := range tests.Tests {
				listed[filepath.Base(tt.InputPath)] = true
			}
			files, _ := filepath.Glob(filepath.Join(dir, "testdata", "*.yaml"))
			for _, f := range files {
				if !listed[filepath.Base(f)] {
					t.Errorf("testdata/%s is not listed in health_test.yaml", filepath.Base(f))
				}
			}
			seen := map[string]bool{}
			for _, tt := range tests.Tests {
				t.Run(filepath.Base(tt.InputPath), func(t *testing.T) {
					obj := readObject(t, filepath.Join(dir, tt.InputPath))
					if obj["kind"] != kind {
						t.Fatalf("%s is a %v, want %s", tt.InputPath, obj["kind"], kind)
					}
					status, message, err := runHealth(string(script), obj)
					if err != nil {
						t.Fatalf("health.lua: %v", err)
					}
					if !argoHealth[status] {
						t.Errorf("status %q is not one Argo CD knows", status)
					}
					if status != tt.HealthStatus.Status || message != tt.HealthStatus.Message {
						t.Errorf("health = %s %q, want %s %q", status, message, tt.HealthStatus.Status, tt.HealthStatus.Message)
					}
					seen[status] = true
				})
			}
			for _, want := range []string{"Healthy", "Progressing", "Degraded"} {
				if !seen[want] {
					t.Errorf("no test reaches %s", want)
				}
			}
		})
	}
}

// A script that crashes on a half-written object would make Argo CD report an error instead of a health.
func TestArgoCDHealthChecksSurviveSparseObjects(t *testing.T) {
	for _, dir := range customizationDirs(t) {
		script, err := os.ReadFile(filepath.Join(dir, "health.lua"))
		if err != nil {
			t.Fatal(err)
		}
		for _, obj := range []map[string]any{
			{},
			{"metadata": map[string]any{}},
			{"metadata": map[string]any{"generation": int64(1)}, "status": map[string]any{}},
			{"metadata": map[string]any{"generation": int64(1)}, "status": map[string]any{"conditions": []any{}}},
		} {
			if status, _, err := runHealth(string(script), obj); err != nil || status != "Progressing" {
				t.Errorf("%s on %v: status %q, error %v; want Progressing", filepath.Base(dir), obj, status, err)
			}
		}
	}
}
