package setup_test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/setup"
	"github.com/gpusharing/gpusharing/controllers/testutil/agentsim"
	b "github.com/gpusharing/gpusharing/controllers/testutil/builders"
	"github.com/gpusharing/gpusharing/test/testenv"
	"github.com/gpusharing/gpusharing/test/wait"
)

// restoreTimeout is short so the test of the bound does not hold the suite up.
const restoreTimeout = 3 * time.Second

var (
	env *testenv.Env
	k8s client.Client
)

// TestMain starts one real API server and one manager with every controller for the whole package.
func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	env, err = testenv.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the test API server:", err)
		}
	}()
	k8s = env.Client
	ctrl.SetLogger(logr.Discard())
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "creating the manager:", err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := setup.Controllers(ctx, mgr, setup.Options{ResolverWorkers: 2, StatusWorkers: 2, RestoreTimeout: restoreTimeout, StatusDebounce: 50 * time.Millisecond,
		// The resolver runs behind its gate as cmd/manager runs it, between one and two reconciles at once.
		WriteLatencyTarget: 50 * time.Millisecond, GateMin: 1,
		// Progress-only status writes are spaced as in cmd/manager, at a tenth of its interval.
		StatusProgressInterval: 500 * time.Millisecond}); err != nil {
		fmt.Fprintln(os.Stderr, "setting up the controllers:", err)
		return 1
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	code := m.Run()
	cancel()
	if err := <-done; err != nil {
		fmt.Fprintln(os.Stderr, "manager:", err)
		return 1
	}
	return code
}

// id turns the test's name into a label value and name prefix no other test shares: policies are
// cluster-scoped, so every test selects only its own nodes.
func id(t *testing.T) string {
	s := strings.ToLower(regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(t.Name(), "-"))
	if len(s) > 40 {
		s = s[len(s)-40:]
	}
	return strings.Trim(s, "-")
}

// addNode creates a Node and its GPUNode with the agent's inventory, as an agent does at start.
func addNode(t *testing.T, name string, gpus []v1.GPUStatus, labels ...string) {
	t.Helper()
	ctx := context.Background()
	if err := k8s.Create(ctx, b.Node(name, labels...)); err != nil {
		t.Fatalf("creating Node %s: %v", name, err)
	}
	gn := b.GPUNode(name)
	if err := k8s.Create(ctx, gn); err != nil {
		t.Fatalf("creating GPUNode %s: %v", name, err)
	}
	if gpus != nil {
		gn.Status.GPUs, gn.Status.GPUCount = gpus, int32(len(gpus))
		if err := k8s.Status().Update(ctx, gn); err != nil {
			t.Fatalf("publishing GPUNode %s inventory: %v", name, err)
		}
	}
	t.Cleanup(func() {
		_ = k8s.Delete(context.Background(), b.Node(name))
		_ = k8s.Delete(context.Background(), b.GPUNode(name))
	})
}

// addPolicy creates a policy; cleanup deletes it and plays the agent for nodes until it is gone.
func addPolicy(t *testing.T, p *v1.GPUSharingPolicy, nodes ...string) *v1.GPUSharingPolicy {
	t.Helper()
	p.CreationTimestamp, p.Generation = metav1.Time{}, 0
	if err := k8s.Create(context.Background(), p); err != nil {
		t.Fatalf("creating policy %s: %v", p.Name, err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = k8s.Delete(ctx, p)
		err := wait.Poll(2*restoreTimeout, func() error {
			for _, n := range nodes {
				_ = agentsim.Ack(ctx, k8s, n, nil)
			}
			err := k8s.Get(ctx, client.ObjectKeyFromObject(p), &v1.GPUSharingPolicy{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("still there (%v)", err)
		})
		if err != nil {
			t.Errorf("policy %s was not deleted within %s: %v", p.Name, 2*restoreTimeout, err)
		}
	})
	return p
}

// ack plays the agent of each node once: every listed GPU reports its desired sharing applied.
func ack(t *testing.T, nodes ...string) {
	t.Helper()
	for _, n := range nodes {
		if err := agentsim.Ack(context.Background(), k8s, n, nil); err != nil {
			t.Fatalf("acking %s: %v", n, err)
		}
	}
}

func getGPUNode(name string) (*v1.GPUNode, error) {
	gn := &v1.GPUNode{}
	return gn, k8s.Get(context.Background(), client.ObjectKey{Name: name}, gn)
}

func getPolicy(name string) (*v1.GPUSharingPolicy, error) {
	p := &v1.GPUSharingPolicy{}
	return p, k8s.Get(context.Background(), client.ObjectKey{Name: name}, p)
}

// specIs checks a node's spec: want maps GPU index to "policy/strategy"; GPUs not in want must be unlisted.
func specIs(name string, want map[int32]string) error {
	gn, err := getGPUNode(name)
	if err != nil {
		return err
	}
	got := map[int32]string{}
	for _, e := range gn.Spec.GPUs {
		got[e.Index] = e.Policy + "/" + string(e.Sharing.Strategy)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		return fmt.Errorf("GPUNode %s spec = %v, want %v", name, got, want)
	}
	return nil
}

// conditionIs checks one condition of a policy; msg, when set, must appear in its message.
func conditionIs(name, condType string, status metav1.ConditionStatus, reason, msg string) error {
	p, err := getPolicy(name)
	if err != nil {
		return err
	}
	c := meta.FindStatusCondition(p.Status.Conditions, condType)
	if c == nil {
		return fmt.Errorf("policy %s has no %s condition", name, condType)
	}
	if c.Status != status || c.Reason != reason || !strings.Contains(c.Message, msg) {
		return fmt.Errorf("policy %s %s = %s/%s %q, want %s/%s containing %q", name, condType, c.Status, c.Reason, c.Message, status, reason, msg)
	}
	return nil
}

// readyWith checks that a policy is Ready with the given counts and has observed its generation.
func readyWith(name string, nodes, gpus int32) error {
	if err := conditionIs(name, v1.ConditionReady, metav1.ConditionTrue, v1.ReasonAsDesired, ""); err != nil {
		return err
	}
	p, err := getPolicy(name)
	if err != nil {
		return err
	}
	st := p.Status
	if st.MatchedNodes != nodes || st.MatchedGPUs != gpus || st.ReadyGPUs != gpus || st.ObservedGeneration != p.Generation {
		return fmt.Errorf("policy %s status = nodes %d GPUs %d ready %d observed %d (generation %d), want %d/%d/%d",
			name, st.MatchedNodes, st.MatchedGPUs, st.ReadyGPUs, st.ObservedGeneration, p.Generation, nodes, gpus, gpus)
	}
	return nil
}

// eventReasons lists the reasons of the events recorded about a policy.
func eventReasons(name string) ([]string, error) {
	var list corev1.EventList
	if err := k8s.List(context.Background(), &list); err != nil {
		return nil, err
	}
	var out []string
	for _, e := range list.Items {
		if e.InvolvedObject.Kind == "GPUSharingPolicy" && e.InvolvedObject.Name == name {
			out = append(out, e.Reason)
		}
	}
	return out, nil
}
