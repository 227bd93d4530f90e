// Package chart tests charts/gpusharing against config/default and the real API server: helm lint and
// render, that the chart renders and installs the objects kustomize does, the admission policy that keeps
// each agent to its own GPUNode, and an upgrade with a policy in flight.
package chart

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gpusharing/gpusharing/test/testenv"
)

var env *testenv.Env

// The chart installs the CRDs, so the API server starts without them.
func TestMain(m *testing.M) { testenv.MainWithoutCRDs(m, &env) }

const namespace = "gpusharing-system"

// runs numbers the runs of this package's tests in one process (go test -count=N). The objects of an
// earlier run stay in the shared API server, so each run names its own: runSuffix() is "-r<run>".
var runs atomic.Int32

func runSuffix() string { return fmt.Sprintf("-r%d", runs.Add(1)) }

// tool runs bin/<name> (helm from $HELM when set) and returns its combined output.
func tool(t *testing.T, name, stdin string, args ...string) (string, error) {
	t.Helper()
	bin := filepath.Join(env.BinDir, name)
	if name == "helm" && os.Getenv("HELM") != "" {
		bin = os.Getenv("HELM")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s not built at %s: run 'make helm control-plane'", name, bin)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// run is tool that fails the test on an error.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := tool(t, name, "", args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

func chartDir() string { return filepath.Join(testenv.RepoRoot(), "charts", "gpusharing") }

func kubeconfig(t *testing.T) string {
	t.Helper()
	k, err := env.AdminKubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return k
}
