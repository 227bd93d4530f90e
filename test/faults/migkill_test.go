package faults

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	b "github.com/gpusharing/gpusharing/controllers/testutil/builders"
	"github.com/gpusharing/gpusharing/test/testenv"
	"github.com/gpusharing/gpusharing/test/wait"
)

// TestAgentKilledMidMIGApplyConvergesWithNoDuplicateWork runs the real agent over a simulated H100 whose
// state outlives it, asks its GPUNode for a four-instance MIG layout, and SIGKILLs the agent right after
// its fourth GPU mutation: MIG mode on, the first instance made (GPU instance and compute instance), and
// the second GPU instance made without its compute instance. A new agent process must finish the
// layout: create only the missing compute instance and the two instances not yet made, destroy nothing,
// enable MIG mode no second time, and report the GPU applied.
func TestAgentKilledMidMIGApplyConvergesWithNoDuplicateWork(t *testing.T) {
	agent, _ := binaries(t)
	env := testenv.StartForTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	kubeconfig, err := env.AdminKubeconfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	kenv := []string{"KUBECONFIG=" + kubeconfig}
	const node = "mig-kill"
	layout := b.MIG("3g.40gb", 1, "2g.20gb", 1, "1g.10gb", 2)
	gn := b.GPUNode(node, b.WithSpec(v1.GPUDesired{UUID: gpu0, Sharing: layout}))
	gn.Generation = 0
	if err := env.Client.Create(ctx, gn); err != nil {
		t.Fatal(err)
	}

	state := filepath.Join(dir, "gpus.json")
	hostRoot := filepath.Join(dir, "host")
	first := start(t, dir, "agent-1", kenv, agentArgs(agent, node, hostRoot, state, "--device-plugin=false", "--simulate-gpus-pause-after=4")...)
	wait.UntilOK(t, 60*time.Second, func() (bool, error) {
		if !first.alive() {
			t.Fatalf("the first agent exited: %v", first.err)
		}
		_, err := os.Stat(nvmlmock.PausedPath(state))
		return err == nil, err
	}, "the first agent reaching its fourth GPU mutation")
	first.kill(t)
	killedAt := journal(t, state)
	t.Logf("first agent SIGKILLed after: %s", strings.Join(killedAt, "; "))
	hw := hardware(t, state)
	if len(hw.GPUs[0].Instances) != 2 || len(hw.GPUs[0].Instances[1].CIs) != 0 {
		t.Fatalf("the kill left %+v, want two GPU instances, the second without its compute instance", hw.GPUs[0].Instances)
	}

	started := time.Now()
	second := start(t, dir, "agent-2", kenv, agentArgs(agent, node, hostRoot, state, "--device-plugin=false")...)
	wait.UntilOK(t, 60*time.Second, func() (bool, error) {
		if !second.alive() {
			t.Fatalf("the second agent exited: %v", second.err)
		}
		return appliedAsDesired(ctx, env.Client, node)
	}, "the second agent reporting the layout applied")
	t.Logf("the second agent applied the layout %s after it started", time.Since(started).Round(10*time.Millisecond))
	checkLayoutMadeOnce(t, state, 4)
	after := journal(t, state)[len(killedAt):]
	if len(after) != 5 || after[0] != "CreateComputeInstance(GI "+strings.Fields(killedAt[3])[len(strings.Fields(killedAt[3]))-1]+") = CI 0" {
		t.Errorf("the second agent did %v, want first the compute instance the first left missing (after %s), then two instances", after, killedAt[3])
	}

	got := &v1.GPUNode{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: node}, got); err != nil {
		t.Fatal(err)
	}
	if len(got.Status.GPUs) != 1 || got.Status.GPUs[0].Applied == nil || got.Status.GPUs[0].Applied.SpecHash != v1.SharingHash(layout) {
		t.Errorf("status GPUs %+v, want GPU 0 applied with the layout's hash", got.Status.GPUs)
	}
}
