package gitops

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/policy"
	"github.com/gpusharing/gpusharing/controllers/resolve"
	"github.com/gpusharing/gpusharing/test/testenv"
)

// An agent from before the Stalled condition writes a GPU's refusal only in the GPU's own Applied
// condition. During a rolling upgrade of the agent such GPUNodes stand beside new ones, and a refusal
// for good must not read as work in progress.

func gpuNodeDir() string {
	return filepath.Join(testenv.RepoRoot(), "config", "argocd", "gpusharing.io", "GPUNode")
}

// luaPermanent is the list of permanent reasons the GPUNode health check carries.
func luaPermanent(t *testing.T, script string) []string {
	t.Helper()
	block := regexp.MustCompile(`(?s)local permanent = \{(.*?)\n\}`).FindStringSubmatch(script)
	if block == nil {
		t.Fatal("health.lua has no 'local permanent = {...}' table")
	}
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(block[1]), "\n") {
		m := regexp.MustCompile(`^\s*(\w+) = true,$`).FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("health.lua: unexpected line in the permanent table: %q", line)
		}
		out = append(out, m[1])
	}
	return out
}

func TestTheGPUNodeHealthCheckListsExactlyTheAPIsPermanentReasons(t *testing.T) {
	script, err := os.ReadFile(filepath.Join(gpuNodeDir(), "health.lua"))
	if err != nil {
		t.Fatal(err)
	}
	got, want := luaPermanent(t, string(script)), v1.HardwareRejectionReasons()
	if !slices.Equal(got, want) {
		t.Errorf("health.lua's permanent reasons\n got %v\nwant %v (v1alpha1.HardwareRejectionReasons, sorted)", got, want)
	}
}

// reasonConstants are the values of every Reason* string constant in api/v1alpha1.
func reasonConstants(t *testing.T) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(testenv.RepoRoot(), "api", "v1alpha1", "conditions.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok {
			return true
		}
		for i, name := range vs.Names {
			if !strings.HasPrefix(name.Name, "Reason") || i >= len(vs.Values) {
				continue
			}
			// A constant defined as another (a deprecated name) has its value listed already.
			if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				v, err := strconv.Unquote(lit.Value)
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, v)
			}
		}
		return true
	})
	if len(out) < 20 {
		t.Fatalf("found only %d reason constants in conditions.go: %v", len(out), out)
	}
	return out
}

// olderAgentGPUNode is an older agent's GPUNode (no Stalled) whose GPU 0 is Applied=False for reason.
func olderAgentGPUNode(t *testing.T, reason string) map[string]any {
	t.Helper()
	obj := readObject(t, filepath.Join(gpuNodeDir(), "testdata", "applying-before-stalled.yaml"))
	gpu := obj["status"].(map[string]any)["gpus"].([]any)[0].(map[string]any)
	for _, c := range gpu["conditions"].([]any) {
		if c := c.(map[string]any); c["type"] == v1.ConditionApplied {
			c["reason"] = reason
		}
	}
	return obj
}

// Every reason the API defines, on GPU 0's Applied=False of a GPUNode without Stalled: the health check
// reads Degraded exactly for the reasons the agent stalls on, Progressing for the others.
func TestAnOlderAgentsGPUNodeIsDegradedExactlyForThePermanentReasons(t *testing.T) {
	script, err := os.ReadFile(filepath.Join(gpuNodeDir(), "health.lua"))
	if err != nil {
		t.Fatal(err)
	}
	for _, reason := range reasonConstants(t) {
		st, msg, err := runHealth(string(script), olderAgentGPUNode(t, reason))
		if err != nil {
			t.Fatalf("%s: %v", reason, err)
		}
		want := "Progressing"
		if v1.IsHardwareRejection(reason) {
			want = "Degraded"
		}
		if st != want {
			t.Errorf("GPU Applied=False %s without Stalled: %s (%s), want %s", reason, st, msg, want)
		}
	}
}

// The policy is what Flux health-checks (GPUNodes are not in Git): the controller derives its Stalled
// from each GPU's own conditions, so a policy whose nodes run an older agent is Failed for kstatus when
// a GPU refused its sharing for good, and InProgress while a GPU is only busy.
func TestKstatusOfAPolicyWhoseGPUNodesAnOlderAgentWrote(t *testing.T) {
	ctx := context.Background()
	for file, want := range map[string]status.Status{
		"hardware-refused-before-stalled.yaml": status.FailedStatus,
		"drain-timed-out-before-stalled.yaml":  status.FailedStatus,
		"xid-error-before-stalled.yaml":        status.FailedStatus,
		"applying-before-stalled.yaml":         status.InProgressStatus,
	} {
		t.Run(file, func(t *testing.T) {
			var node v1.GPUNode
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(readObject(t, filepath.Join(gpuNodeDir(), "testdata", file)), &node); err != nil {
				t.Fatal(err)
			}
			if len(node.Status.Conditions) == 0 || slices.ContainsFunc(node.Status.Conditions, func(c metav1.Condition) bool {
				return c.Type == v1.ConditionStalled || c.Type == v1.ConditionReconciling
			}) {
				t.Fatalf("%s is not in the older shape (conditions without Stalled and Reconciling): %+v", file, node.Status.Conditions)
			}
			p := &v1.GPUSharingPolicy{
				ObjectMeta: metav1.ObjectMeta{Name: "older-agent-" + strings.TrimSuffix(file, ".yaml")},
				Spec: v1.GPUSharingPolicySpec{Priority: 10, NodeSelector: &v1.NodeSelector{MatchLabels: map[string]v1.LabelValue{"pool": "inference"}},
					Sharing: v1.Sharing{Strategy: v1.StrategyMPS, MPS: &v1.MPSSharing{Replicas: 4}}},
			}
			if err := env.Client.Create(ctx, p); err != nil {
				t.Fatal(err)
			}
			// The policy has no finalizer: it is gone once deleted, and a second run of the test creates it anew.
			t.Cleanup(func() { _ = env.Client.Delete(ctx, p) })
			// The controller wrote this generation of the policy into the node's spec.
			node.Spec.GPUs[0].Policy, node.Spec.GPUs[0].PolicyGeneration = p.Name, p.Generation
			node.Generation, node.Status.ObservedGeneration = 1, 1
			s := policy.Summarize(p, resolve.Compile([]*v1.GPUSharingPolicy{p}), []policy.NodeView{{GPUNode: &node, Labels: map[string]string{"pool": "inference"}}})
			policy.SetStatus(p, s, 1)
			p.Status.ObservedGeneration = p.Generation
			if err := env.Client.Status().Update(ctx, p); err != nil {
				t.Fatal(err)
			}
			if res := kstatusOf(t, p); res.Status != want {
				t.Errorf("kstatus = %s (%s), want %s; summary %+v", res.Status, res.Message, want, s)
			}
		})
	}
}
