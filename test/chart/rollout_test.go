package chart

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/gpunode"
	"github.com/gpusharing/gpusharing/controllers/setup"
	"github.com/gpusharing/gpusharing/test/simnode"
	"github.com/gpusharing/gpusharing/test/testenv"
	"github.com/gpusharing/gpusharing/test/wait"
)

// asServiceAccount is the admin config impersonating one of the chart's service accounts, with the
// node-name claim a pod-bound token carries when node is set.
func asServiceAccount(name, node string) *rest.Config {
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + namespace + ":" + name,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
	}
	if node != "" {
		cfg.Impersonate.Extra = map[string][]string{"authentication.kubernetes.io/node-name": {node}}
	}
	return cfg
}

// startManager runs the real controller under the chart's manager service account until stop is called.
func startManager(t *testing.T, errs chan<- error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	mgr, err := ctrl.NewManager(asServiceAccount("gpusharing-manager", ""), ctrl.Options{
		Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := setup.Controllers(ctx, mgr, setup.Options{SkipNameValidation: true}); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			errs <- fmt.Errorf("manager: %w", err)
		}
	}()
	return func() { cancel(); <-done }
}

// waitReady waits until the policy has observed its generation and is Ready on gpus GPUs.
func waitReady(t *testing.T, p *v1.GPUSharingPolicy, gpus int32, errs <-chan error) {
	t.Helper()
	ctx := context.Background()
	wait.UntilState(t, 90*time.Second, func() (bool, string) {
		select {
		case err := <-errs:
			t.Fatalf("a component stopped: %v", err)
		default:
		}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
			t.Fatal(err)
		}
		return p.Status.ObservedGeneration == p.Generation && p.Status.ReadyGPUs == gpus &&
			meta.IsStatusConditionTrue(p.Status.Conditions, v1.ConditionReady), fmt.Sprintf("%+v", p.Status)
	}, "policy %s Ready on %d GPUs", p.Name, gpus)
}

// lookAgain changes a label of each node's Node and GPUNode (no selector reads it; no spec or status
// changes) and waits until the controller has reconciled every node and every agent its GPUNode since:
// a check made afterwards that nothing changed knows they all had their chance to act.
func lookAgain(t *testing.T, nodes ...string) {
	t.Helper()
	ctx := context.Background()
	resolver, agent := testenv.Reconciles(t, gpunode.ControllerName), testenv.Reconciles(t, "gpunode-agent")
	poke := fmt.Sprint(time.Now().UnixNano())
	for _, name := range nodes {
		for _, obj := range []client.Object{&corev1.Node{}, &v1.GPUNode{}} {
			err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
				if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, obj); err != nil {
					return err
				}
				labels := obj.GetLabels()
				if labels == nil {
					labels = map[string]string{}
				}
				labels["test.gpusharing.io/poke"] = poke
				obj.SetLabels(labels)
				return env.Client.Update(ctx, obj)
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	want := float64(len(nodes))
	wait.UntilState(t, 60*time.Second, func() (bool, string) {
		r, a := testenv.Reconciles(t, gpunode.ControllerName)-resolver, testenv.Reconciles(t, "gpunode-agent")-agent
		return r >= want && a >= want, fmt.Sprintf("%v controller and %v agent reconciles since the poke", r, a)
	}, "the controller and the agents reconciled the %d nodes again", len(nodes))
}

// The chart's upgrade during a disruptive rollout, with the real controller and the real agents of two
// simulated nodes running under the chart's service accounts, RBAC and admission policy: the rollout
// finishes with exactly one spec write per node for the change, and afterwards nothing is applied again.
// The controller is restarted across the upgrade as its Deployment's rollout restarts it. (Node b's
// agent keeps running: a simulated node's GPUs live in its process, so its restart would lose them; that
// an upgraded agent reads the applied GPUs as applied is what TestChartUpgradeWithAPolicyInFlightLeaves-
// GPUNodesAlone and api/v1alpha1's hash tests pin.)
func TestChartUpgradeDuringADisruptiveRolloutWithTheRealControllerAndAgents(t *testing.T) {
	install(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 4)
	stopManager := startManager(t, errs)
	defer func() { stopManager() }()

	dir, err := os.MkdirTemp("", "chart")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { simnode.StopDaemons(dir); _ = os.RemoveAll(dir) })
	sfx := runSuffix()
	seq := 200 + 2*int(runs.Load()) // GPU UUIDs of this run's own
	pool := "upgrade" + sfx
	nodes := []simnode.Node{
		{Name: "upgrade-a" + sfx, Model: "H100", GPUs: 1, Labels: map[string]string{"pool": pool}, Seq: seq + 1},
		{Name: "upgrade-b" + sfx, Model: "H100", GPUs: 1, Labels: map[string]string{"pool": pool}, Seq: seq + 2},
	}
	// Each agent has its own lifetime, so that node a's can be stopped to hold the rollout in flight.
	stopAgent := map[string]context.CancelFunc{}
	startAgent := func(n simnode.Node) {
		actx, acancel := context.WithCancel(ctx)
		stopAgent[n.Name] = acancel
		if err := simnode.Start(actx, asServiceAccount("gpusharing-agent", n.Name), env.Scheme, n, dir, errs); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range nodes {
		if err := simnode.CreateNode(ctx, env.Client, n); err != nil {
			t.Fatal(err)
		}
		startAgent(n)
	}
	one := intstr.FromInt32(1)
	p := &v1.GPUSharingPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "upgrade-rollout" + sfx},
		Spec: v1.GPUSharingPolicySpec{
			// Above the other tests' policy, which selects every node.
			Priority:     10,
			NodeSelector: &v1.NodeSelector{MatchLabels: map[string]v1.LabelValue{"pool": v1.LabelValue(pool)}},
			Sharing:      v1.Sharing{Strategy: v1.StrategyMPS, MPS: &v1.MPSSharing{Replicas: 2}},
			Rollout:      v1.Rollout{MaxUnavailable: &one},
		},
	}
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	waitReady(t, p, 2, errs)
	generations := map[string]int64{}
	for _, n := range nodes {
		g := &v1.GPUNode{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: n.Name}, g); err != nil {
			t.Fatal(err)
		}
		generations[n.Name] = g.Generation
	}

	// A disruptive change (MPS to MIG) with maxUnavailable 1: one node at a time. Node a's agent is
	// stopped first, so the node admitted first cannot finish and the rollout stays in flight (one node
	// written, the other waiting its turn) until the upgrade is done.
	stopAgent[nodes[0].Name]()
	testenv.Update(t, ctx, env.Client, p, func(p *v1.GPUSharingPolicy) {
		p.Spec.Sharing = v1.Sharing{Strategy: v1.StrategyMIG, MIG: &v1.MIGSharing{Instances: []v1.MIGInstanceRequest{{Profile: "3g.40gb", Count: 1}, {Profile: "1g.10gb", Count: 4}}}}
	})
	wait.UntilState(t, 60*time.Second, func() (bool, string) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
			t.Fatal(err)
		}
		c := meta.FindStatusCondition(p.Status.Conditions, v1.ConditionProgressing)
		return p.Status.ObservedGeneration == p.Generation && c != nil && c.Reason == v1.ReasonWaitingForRollout,
			fmt.Sprintf("%+v", p.Status.Conditions)
	}, "the MIG change in flight with a node waiting")
	run(t, "helm", "upgrade", "gpusharing", chartDir(), "--kubeconfig", kubeconfig(t), "--namespace", namespace,
		"--set", "manager.image.tag=v0.2.0", "--set", "agent.image.tag=v0.2.0", "--set", "agent.oversubReserve=3Gi", "--wait=false")
	stopManager()
	stopManager = startManager(t, errs)
	// Node a's agent comes back (on a simulated node its GPUs start afresh, as after a reboot).
	startAgent(nodes[0])
	waitReady(t, p, 2, errs)

	settled := map[string]*v1.GPUNode{}
	for _, n := range nodes {
		g := &v1.GPUNode{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: n.Name}, g); err != nil {
			t.Fatal(err)
		}
		// One spec write per node for the change: the upgrade and the restart rewrote nothing.
		if g.Generation != generations[n.Name]+1 {
			t.Errorf("GPUNode %s generation %d -> %d, want exactly one spec write for the MIG change", n.Name, generations[n.Name], g.Generation)
		}
		if len(g.Status.GPUs) != 1 || g.Status.GPUs[0].Applied == nil || len(g.Status.GPUs[0].Applied.MIGInstances) != 5 {
			t.Fatalf("GPUNode %s status after the rollout: %+v", n.Name, g.Status.GPUs)
		}
		settled[n.Name] = g
	}
	// Nothing is applied again afterwards: the status (MIG instance uuids included) stays as it is while
	// the restarted controller and the agents look at the nodes again.
	lookAgain(t, nodes[0].Name, nodes[1].Name)
	for _, n := range nodes {
		g := &v1.GPUNode{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: n.Name}, g); err != nil {
			t.Fatal(err)
		}
		before := settled[n.Name]
		if g.Generation != before.Generation || g.Status.GPUs[0].Applied.SpecHash != before.Status.GPUs[0].Applied.SpecHash {
			t.Errorf("GPUNode %s changed after the rollout settled: generation %d -> %d", n.Name, before.Generation, g.Generation)
		}
		for i, in := range g.Status.GPUs[0].Applied.MIGInstances {
			if in.UUID != before.Status.GPUs[0].Applied.MIGInstances[i].UUID {
				t.Errorf("GPUNode %s MIG instance %d re-created (%s -> %s)", n.Name, i, before.Status.GPUs[0].Applied.MIGInstances[i].UUID, in.UUID)
			}
		}
	}
}
