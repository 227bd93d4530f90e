package deploy

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/setup"
	"github.com/gpusharing/gpusharing/test/simnode"
)

// as returns the admin config impersonating a service account, which holds only what RBAC grants it.
func as(account string) *rest.Config {
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: account,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
	}
	return cfg
}

// asAgentOn is the agent's service account with a token bound to a pod on node, as the kubelet projects
// it: the API server puts the node's name into the user's extra, which config/admission checks.
func asAgentOn(node string) *rest.Config {
	cfg := as(agentAccount)
	cfg.Impersonate.Extra = map[string][]string{"authentication.kubernetes.io/node-name": {node}}
	return cfg
}

func TestServiceAccountsHoldNothingBeyondTheirRoles(t *testing.T) {
	install(t)
	ctx := context.Background()
	agent, err := client.New(as(agentAccount), client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := agent.List(ctx, &v1alpha1.GPUSharingPolicyList{}); !apierrors.IsForbidden(err) {
		t.Errorf("the agent's service account listed policies (err %v); RBAC is not what the roles say", err)
	}
	manager, err := client.New(as(managerAccount), client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	node := &v1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: "rbac-probe"}}
	if err := manager.Create(ctx, node); !apierrors.IsForbidden(err) {
		t.Errorf("the manager's service account created a GPUNode (err %v); only agents create them", err)
	}
}

func TestControllerAndAgentConvergeWithOnlyTheirServiceAccounts(t *testing.T) {
	install(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 2)

	mgr, err := ctrl.NewManager(as(managerAccount), ctrl.Options{
		Scheme:                  env.Scheme,
		Metrics:                 metricsserver.Options{BindAddress: "0"},
		LeaderElection:          true,
		LeaderElectionNamespace: namespace,
		LeaderElectionID:        "gpusharing-controller.gpusharing.io",
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := setup.Controllers(ctx, mgr, setup.Options{SkipNameValidation: true}); err != nil {
		t.Fatal(err)
	}
	go func() {
		if err := mgr.Start(ctx); err != nil {
			errs <- err
		}
	}()

	n := simnode.Node{Name: "rbac-node", Model: "H100", GPUs: 2, Labels: map[string]string{"pool": "rbac"}, Seq: 77}
	simnode.StartForTest(t, ctx, env.Client, asAgentOn(n.Name), env.Scheme, n, errs)

	replicas := int32(2)
	policy := &v1alpha1.GPUSharingPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "rbac-mps"},
		Spec: v1alpha1.GPUSharingPolicySpec{
			NodeSelector: &v1alpha1.NodeSelector{MatchLabels: map[string]v1alpha1.LabelValue{"pool": "rbac"}},
			Sharing:      v1alpha1.Sharing{Strategy: v1alpha1.StrategyMPS, MPS: &v1alpha1.MPSSharing{Replicas: replicas}},
		},
	}
	if err := env.Client.Create(ctx, policy); err != nil {
		t.Fatal(err)
	}

	deadline := time.After(90 * time.Second)
	for {
		p := &v1alpha1.GPUSharingPolicy{}
		if err := env.Client.Get(ctx, types.NamespacedName{Name: policy.Name}, p); err != nil {
			t.Fatal(err)
		}
		if c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionReady); c != nil && c.Status == metav1.ConditionTrue && p.Status.ReadyGPUs == 2 {
			return
		}
		select {
		case err := <-errs:
			t.Fatalf("a component stopped: %v", err)
		case <-deadline:
			t.Fatalf("the policy did not become Ready with 2 GPUs under the service accounts' permissions; status: %+v", p.Status)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
