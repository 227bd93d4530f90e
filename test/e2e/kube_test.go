//go:build e2e

package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/test/testenv"
)

// kubectl runs bin/kubectl as the cluster admin from the repository root (docs/deploy.md's commands are
// run as written) and fails the test on error.
func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := kubectlErr(args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func kubectlErr(args ...string) (string, error) {
	root := testenv.RepoRoot()
	cmd := exec.Command(filepath.Join(node.Bin, "kubectl"), append([]string{"--kubeconfig", node.Kubeconfig}, args...)...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	return string(out), err
}

var k8s client.Client

func clientFor(t *testing.T) client.Client {
	t.Helper()
	if k8s == nil {
		c, err := client.New(node.Config, client.Options{Scheme: testenv.Scheme()})
		if err != nil {
			t.Fatal(err)
		}
		k8s = c
	}
	return k8s
}

// eventually polls check every 500ms until it returns nil or timeout passes, then fails with its last error.
func eventually(t *testing.T, timeout time.Duration, what string, check func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last error
	for {
		if last = check(ctx); last == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not within %s: %v", what, timeout, last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// dumpOnFailure prints what an operator would look at when a scenario fails: pods, events, the
// gpusharing objects and the operator's logs.
func dumpOnFailure(t *testing.T) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, args := range [][]string{
			{"get", "pods", "-A", "-o", "wide"},
			{"get", "events", "-A", "--sort-by=.lastTimestamp"},
			{"get", "gpusharing", "-o", "wide"},
			{"get", "gpunodes", "-o", "yaml"},
			{"get", "nodes", "-o", "yaml"},
			{"-n", "gpusharing-system", "logs", "-l", "app.kubernetes.io/name=gpusharing-manager", "--tail=60", "--all-containers"},
			{"-n", "gpusharing-system", "logs", "-l", "app.kubernetes.io/name=gpusharing-agent", "--tail=60", "--all-containers"},
		} {
			out, _ := kubectlErr(args...)
			t.Logf("kubectl %s:\n%s", strings.Join(args, " "), out)
		}
	})
}

func writeFile(path, content string) error { return os.WriteFile(path, []byte(content), 0o644) }

// ensureNamespace creates the workloads' namespace unless an earlier scenario did (scenarios can be run
// alone after Install and Sharing: go test -run 'TestE2E/(Install|Sharing|Upgrade)').
func ensureNamespace(t *testing.T) {
	t.Helper()
	if out, err := kubectlErr("get", "namespace", Namespace); err == nil {
		return
	} else if !strings.Contains(out, "NotFound") {
		t.Fatalf("kubectl get namespace %s: %v: %s", Namespace, err, out)
	}
	kubectl(t, "create", "namespace", Namespace)
}
