package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	b "github.com/gpusharing/gpusharing/controllers/testutil/builders"
	"github.com/gpusharing/gpusharing/test/fakekubelet"
	"github.com/gpusharing/gpusharing/test/testenv"
	"github.com/gpusharing/gpusharing/test/wait"
)

// auditPolicy records every pod eviction once, when its response is sent.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  resources:
  - group: ""
    resources: ["pods/eviction"]
- level: None
`

// startWithAudit runs the API server with an audit log of pod evictions and returns its path.
func startWithAudit(t *testing.T, dir string) (*testenv.Env, string) {
	t.Helper()
	policy, log := filepath.Join(dir, "audit-policy.yaml"), filepath.Join(dir, "audit.log")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	env, err := testenv.StartWith(testenv.Options{APIServerFlags: map[string]string{"audit-policy-file": policy, "audit-log-path": log}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	return env, log
}

// evictions counts the eviction requests of a pod the API server answered, whatever the answer. The
// API server appends each event after its response, so a line still being written (no newline yet) is
// not counted.
func evictions(t *testing.T, log, ns, name string) int {
	t.Helper()
	b, err := os.ReadFile(log)
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(b, []byte("\n"))
	lines = lines[:len(lines)-1] // after the last newline: empty, or a line not complete yet
	n := 0
	for _, line := range lines {
		var ev struct {
			Verb      string `json:"verb"`
			Stage     string `json:"stage"`
			ObjectRef struct {
				Resource, Subresource, Namespace, Name string
			} `json:"objectRef"`
		}
		if err := json.Unmarshal(line, &ev); err != nil {
			t.Fatal(err)
		}
		o := ev.ObjectRef
		if ev.Verb == "create" && ev.Stage == "ResponseComplete" && o.Resource == "pods" && o.Subresource == "eviction" && o.Namespace == ns && o.Name == name {
			n++
		}
	}
	return n
}

// TestAgentKilledMidDrainResumesWithoutEvictingTwice runs the real agent with its device plugin and drain
// (a fake kubelet's Registration and PodResources), a pod holding the whole GPU, and asks the GPU for a MIG
// layout with drain mode Evict. Once the eviction went through (the pod terminating, still on the GPU as a
// pod whose containers have not stopped), the agent is SIGKILLed. A new agent process must resume the
// drain: not evict the pod again (the API server's audit log counts the eviction requests), wait for it
// to end, then apply the layout exactly once.
func TestAgentKilledMidDrainResumesWithoutEvictingTwice(t *testing.T) {
	agent, _ := binaries(t)
	dir := t.TempDir()
	env, audit := startWithAudit(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	kubeconfig, err := env.AdminKubeconfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	kenv := []string{"KUBECONFIG=" + kubeconfig}
	// Unix socket paths are short: a directory of its own under /tmp.
	sockDir, err := os.MkdirTemp("", "fk")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(sockDir) })
	kubelet, err := fakekubelet.Start(sockDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kubelet.Stop)
	podRes, err := fakekubelet.StartPodResources(filepath.Join(sockDir, "pr.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(podRes.Stop)

	const node, ns = "drain-kill", "default"
	gn := b.GPUNode(node, b.WithSpec(v1.GPUDesired{UUID: gpu0, Sharing: b.Exclusive()}))
	gn.Generation = 0
	if err := env.Client.Create(ctx, gn); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "gpus.json")
	args := func() []string {
		return agentArgs(agent, node, filepath.Join(dir, "host"), state, "--device-plugin-dir="+sockDir,
			"--pod-resources-socket="+podRes.Path(), "--drain-poll-interval=200ms")
	}
	first := start(t, dir, "agent-1", kenv, args()...)
	wait.UntilOK(t, 60*time.Second, func() (bool, error) {
		return appliedAsDesired(ctx, env.Client, node)
	}, "the first agent applying Exclusive")

	// The pod the kubelet says holds the GPU, bound to this node and running.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "trainer"},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "main", Image: "example.com/cuda:1"}}}}
	if err := env.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	env.SetPodPhase(t, ctx, pod, corev1.PodRunning)
	podRes.SetPods(fakekubelet.Pod(ns, pod.Name, "nvidia.com/gpu", gpu0))

	layout := b.MIG("3g.40gb", 2)
	testenv.Update(t, ctx, env.Client, gn, func(gn *v1.GPUNode) {
		gn.Spec.GPUs[0].Sharing = layout
		gn.Spec.GPUs[0].Drain = &v1.Drain{Mode: v1.DrainEvict, Timeout: &metav1.Duration{Duration: 2 * time.Minute}}
	})
	wait.UntilOK(t, 60*time.Second, func() (bool, error) {
		got := &corev1.Pod{}
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(pod), got)
		return err == nil && got.DeletionTimestamp != nil && evictions(t, audit, ns, pod.Name) > 0, err
	}, "the first agent evicting the pod (the pod terminating, the eviction in the audit log)")
	first.kill(t)
	if n := evictions(t, audit, ns, pod.Name); n != 1 {
		t.Fatalf("the first agent asked %d evictions before the kill, want 1", n)
	}
	if j := journal(t, state); len(j) != 0 {
		t.Fatalf("the first agent changed the GPU before the pod ended: %v", j)
	}

	second := start(t, dir, "agent-2", kenv, args()...)
	wait.UntilOK(t, 60*time.Second, func() (bool, error) {
		if !second.alive() {
			t.Fatalf("the second agent exited: %v", second.err)
		}
		out, err := os.ReadFile(second.log)
		return strings.Contains(string(out), `step="Waiting"`), err
	}, "the second agent's drain waiting for the pod")
	// More polls of the drain, each of which lists the kubelet's pods and then evicts what it must: a
	// second eviction, were there one, is in the audit log once three more lists were answered (the device
	// plugin's kubelet checks list too, at a slower pace: a fourth covers one of those).
	listed := podRes.Lists()
	wait.UntilState(t, 60*time.Second, func() (bool, string) {
		return podRes.Lists() >= listed+4, fmt.Sprintf("%d lists since the drain waited", podRes.Lists()-listed)
	}, "the second agent's drain polled the kubelet three more times")
	if j := journal(t, state); len(j) != 0 {
		t.Fatalf("the second agent changed the GPU while the pod still held it: %v", j)
	}

	// The kubelet stops the containers and confirms the deletion.
	podRes.RemovePod(ns, pod.Name)
	if err := env.Client.Delete(ctx, pod, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	ended := time.Now()
	wait.UntilOK(t, 60*time.Second, func() (bool, error) {
		return appliedAsDesired(ctx, env.Client, node)
	}, "the second agent applying the layout")
	t.Logf("the layout was applied %s after the pod ended", time.Since(ended).Round(10*time.Millisecond))
	if n := evictions(t, audit, ns, pod.Name); n != 1 {
		t.Errorf("the pod was asked to be evicted %d times in all, want once (the second agent must resume the drain, not evict again)", n)
	}
	checkLayoutMadeOnce(t, state, 2)
}
