package deploy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/test/wait"
)

// driver is the DRA driver name the agent publishes under (agent/dra.DriverName).
const driver = "gpu.gpusharing.io"

// agentClient is the agent's service account on node ("" for a token bound to no node).
func agentClient(t *testing.T, node string) client.Client {
	t.Helper()
	cfg := as(agentAccount)
	if node != "" {
		cfg = asAgentOn(node)
	}
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func slice(name, node, drv string) *resourcev1.ResourceSlice {
	return &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourcev1.ResourceSliceSpec{
			Driver:   drv,
			NodeName: &node,
			Pool:     resourcev1.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			Devices:  []resourcev1.Device{{Name: "gpu-0"}},
		},
	}
}

// refusedSaying fails unless err is the API server's refusal and says want.
func refusedSaying(t *testing.T, what string, err error, want string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: the API server allowed it", what)
		return
	}
	if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
		t.Errorf("%s: err %v, want a refusal", what, err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("%s: refusal %q does not say %q", what, err, want)
	}
}

func TestAgentOfOneNodeWritesOnlyItsOwnNodesResourceSlices(t *testing.T) {
	install(t)
	ctx := context.Background()
	nodeA, nodeB := "slice-node-a", "slice-node-b"
	agentA := agentClient(t, nodeA)
	says := fmt.Sprintf("may write only ResourceSlices of driver %s with spec.nodeName %s", driver, nodeA)

	// The agent's DRA role lets it create slices; until the API server has compiled the policy, RBAC alone
	// would admit node b's slice, which is what the policy exists to prevent. A dry run creates nothing.
	var err error
	wait.UntilState(t, 60*time.Second, func() (bool, string) {
		err = agentA.Create(ctx, slice("forged-b", nodeB, driver), client.DryRunAll)
		return err != nil, "node a's agent may create a slice of node b"
	}, "the API server refuses node a's agent a slice of node b")
	refusedSaying(t, "creating a slice of another node", err, says)

	own := slice("own-a", nodeA, driver)
	if err := agentA.Create(ctx, own); err != nil {
		t.Fatalf("the agent could not create its own node's slice: %v", err)
	}
	own.Spec.Pool.Generation = 2
	if err := agentA.Update(ctx, own); err != nil {
		t.Fatalf("the agent could not update its own node's slice: %v", err)
	}
	theirs := slice("theirs-b", nodeB, driver)
	if err := env.Client.Create(ctx, theirs); err != nil {
		t.Fatal(err)
	}
	otherDriver := slice("other-driver-a", nodeA, "gpu.example.com")
	if err := env.Client.Create(ctx, otherDriver); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name  string
		write func() error
		says  string
	}{
		{"updating another node's slice", func() error {
			s := theirs.DeepCopy()
			s.Spec.Devices = append(s.Spec.Devices, resourcev1.Device{Name: "forged"})
			return agentA.Update(ctx, s)
		}, says},
		{"deleting another node's slice", func() error { return agentA.Delete(ctx, theirs.DeepCopy()) }, says},
		{"creating a slice of its node under another driver", func() error {
			return agentA.Create(ctx, slice("forged-driver-a", nodeA, "gpu.example.com"))
		}, says},
		{"deleting another driver's slice of its node", func() error { return agentA.Delete(ctx, otherDriver.DeepCopy()) }, says},
		{"writing with a token bound to no node", func() error {
			return agentClient(t, "").Create(ctx, slice("no-node", nodeA, driver))
		}, "carries no node name"},
	} {
		t.Run(tc.name, func(t *testing.T) { refusedSaying(t, tc.name, tc.write(), tc.says) })
	}

	if err := agentA.Delete(ctx, own); err != nil {
		t.Errorf("the agent could not delete its own node's slice: %v", err)
	}
	// Other users (the kube-scheduler, admins, other drivers) are not matched by the policy.
	if err := env.Client.Delete(ctx, theirs); err != nil {
		t.Errorf("an admin could not delete node b's slice: %v", err)
	}
}

// boundPod creates a pod in ns bound to node ("" leaves it unbound).
func boundPod(t *testing.T, ctx context.Context, ns, name, node string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "main", Image: "example.com/cuda:1"}}},
	}
	if err := env.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	return pod
}

func evict(cfg *rest.Config, pod *corev1.Pod, dryRun bool) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name}}
	ev.DeleteOptions = &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}}
	if dryRun {
		ev.DeleteOptions.DryRun = []string{metav1.DryRunAll}
	}
	return cs.PolicyV1().Evictions(pod.Namespace).Evict(context.Background(), ev)
}

func TestAgentOfOneNodeEvictsOnlyPodsBoundToItsNode(t *testing.T) {
	install(t)
	ctx := context.Background()
	ns := "evict-probe"
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	nodeA, nodeB := "evict-node-a", "evict-node-b"
	podA := boundPod(t, ctx, ns, "on-a", nodeA)
	podB := boundPod(t, ctx, ns, "on-b", nodeB)
	unbound := boundPod(t, ctx, ns, "unbound", "")

	// RBAC lets the agent evict any pod; until the API server has compiled the policy (and its pod
	// parameters have synced) it would admit this. A dry run evicts nothing.
	var err error
	wait.UntilState(t, 60*time.Second, func() (bool, string) {
		err = evict(asAgentOn(nodeA), podB, true)
		return err != nil, "node a's agent may evict a pod of node b"
	}, "the API server refuses node a's agent the eviction of a pod of node b")
	refusedSaying(t, "evicting a pod of another node", err, fmt.Sprintf("may evict only pods bound to that node; pod %s/%s is bound to node %s", ns, podB.Name, nodeB))
	refusedSaying(t, "evicting an unbound pod", evict(asAgentOn(nodeA), unbound, true), "is bound to no node")
	refusedSaying(t, "evicting with a token bound to no node", evict(as(agentAccount), podA, true), "carries no node name")

	if err := evict(asAgentOn(nodeA), podA, false); err != nil {
		t.Fatalf("the agent of node a could not evict a pod bound to node a: %v", err)
	}
	wait.UntilState(t, 30*time.Second, func() (bool, string) {
		p := &corev1.Pod{}
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(podA), p)
		if apierrors.IsNotFound(err) {
			return true, ""
		}
		return err == nil && p.DeletionTimestamp != nil, fmt.Sprintf("pod %s not being deleted (err %v)", podA.Name, err)
	}, "the evicted pod of node a is deleted")
	p := &corev1.Pod{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(podB), p); err != nil || p.DeletionTimestamp != nil {
		t.Errorf("pod of node b was touched: err %v, deletionTimestamp %v", err, p.DeletionTimestamp)
	}
	// Other users (kubectl drain, the kubelet, admins) are not matched by the policy.
	if err := evict(env.Config, podB, true); err != nil {
		t.Errorf("an admin could not evict a pod of node b: %v", err)
	}
}

// podBoundToken is what the kubelet projects into the agent's pod on node: a token of the agent's service
// account bound to a pod scheduled there, from which the API server derives the node-name claim.
func podBoundToken(t *testing.T, ctx context.Context, node string) *rest.Config {
	t.Helper()
	if err := env.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "agent-" + node},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: "gpusharing-agent",
			Containers: []corev1.Container{{Name: "agent", Image: "gpusharing/agent:test"}}},
	}
	if err := env.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, "gpusharing-agent", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(env.Config)
	cfg.BearerToken = tr.Status.Token
	return cfg
}

// The tests above impersonate the node-name claim; this one holds a real token bound to a pod on a node,
// as the kubelet gives the agent, and checks that the policies read the node from it.
func TestAPodBoundTokenOfTheAgentCarriesItsNodeToThePolicies(t *testing.T) {
	install(t)
	ctx := context.Background()
	ns := "token-probe"
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	nodeA, nodeB := "token-node-a", "token-node-b"
	agentA := podBoundToken(t, ctx, nodeA)
	podA := boundPod(t, ctx, ns, "on-a", nodeA)
	podB := boundPod(t, ctx, ns, "on-b", nodeB)

	var err error
	wait.UntilState(t, 60*time.Second, func() (bool, string) {
		err = evict(agentA, podB, true)
		return err != nil, "the token of node a's agent may evict a pod of node b"
	}, "the API server refuses the eviction of a pod of node b to the token of node a's agent")
	refusedSaying(t, "evicting a pod of another node with a pod-bound token", err,
		fmt.Sprintf("the gpusharing agent on node %s may evict only pods bound to that node", nodeA))
	if err := evict(agentA, podA, true); err != nil {
		t.Errorf("the token of node a's agent could not evict (dry run) a pod bound to node a: %v", err)
	}
}
