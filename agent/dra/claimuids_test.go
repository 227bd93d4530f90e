package dra_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/test/testenv"
	"github.com/gpusharing/gpusharing/test/wait"
)

// uidString renders a view's claims as "name pods uids".
func uidString(v dra.ClaimView) string {
	var out []string
	for _, c := range v.Claims {
		out = append(out, fmt.Sprintf("%s %v %v", c.Name, c.Pods, c.PodUIDs))
	}
	return fmt.Sprint(out)
}

// preparedSharedClaim is a sized claim "shared" reserved for pod "first", prepared by a plugin over dirs.
func preparedSharedClaim(t *testing.T) (context.Context, *testenv.Env, pluginDirs, *dra.KubeletPlugin) {
	ctx, env := draCluster(t)
	shared := sizedHeldClaim(t, ctx, env.Client, "shared", nodeName, "gpu-0-sized", "8Gi", "first")
	dirs := newPluginDirs(t)
	p := restartedPlugin(t, dirs)
	runPlugin(t, ctx, env, p)
	if err := prepareOne(ctx, p, shared); err != nil {
		t.Fatal(err)
	}
	return ctx, env, dirs, p
}

// reserveSecondPod reserves the claim "shared" for pod "second" too, as the scheduler does (the kubelet
// does not prepare it again), asks p to read the node's claims and waits until render(view) is want.
func reserveSecondPod(t *testing.T, ctx context.Context, c client.Client, p *dra.KubeletPlugin, render func(dra.ClaimView) string, want, what string) {
	t.Helper()
	shared := getClaim(t, ctx, c, "shared")
	reserve(shared, "first", "second")
	if err := c.Status().Update(ctx, shared); err != nil {
		t.Fatal(err)
	}
	before := p.ClaimView().SyncedAt
	p.RequestClaimSync()
	wait.UntilState(t, 30*time.Second, func() (bool, string) {
		v := p.ClaimView()
		return v.SyncedAt.After(before) && render(v) == want, render(v)
	}, "%s", what)
}

// restartedPlugin is the plugin an agent restarted over dirs holds before it reads the API server: what
// its checkpoint says.
func restartedPlugin(t *testing.T, dirs pluginDirs) *dra.KubeletPlugin {
	t.Helper()
	p, err := dra.NewKubeletPlugin(nodeName, dirs.config(), dpConfig, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	p.Update(sizedMPSAndShimNode())
	return p
}

// A claim's pods are recorded with their UIDs, which a process's cgroup names: the checkpoint keeps them
// across a restart without the API server, and a second pod reserved later joins them as its name does.
func TestTheClaimViewKeepsThePodUIDsOfAClaimAcrossARestart(t *testing.T) {
	ctx, env, dirs, p := preparedSharedClaim(t)
	if got, want := uidString(restartedPlugin(t, dirs).ClaimView()), "[shared [first] [uid-first]]"; got != want {
		t.Fatalf("view from the checkpoint alone: %s, want %s", got, want)
	}
	reserveSecondPod(t, ctx, env.Client, p, uidString, "[shared [first second] [uid-first uid-second]]", "the second pod's UID in the view")
}

// A checkpoint written before pod UIDs were recorded still reads: its claims have their pod names and no
// UIDs until the API server is read.
func TestACheckpointWithoutPodUIDsReadsWithNames(t *testing.T) {
	_, _, dirs, _ := preparedSharedClaim(t)
	path := filepath.Join(dirs.plugin, dra.CheckpointFile)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cp map[string]any
	if err := json.Unmarshal(raw, &cp); err != nil {
		t.Fatal(err)
	}
	stripped := 0
	for _, claim := range cp["claims"].(map[string]any) {
		if _, ok := claim.(map[string]any)["podUIDs"]; ok {
			delete(claim.(map[string]any), "podUIDs")
			stripped++
		}
	}
	if stripped != 1 {
		t.Fatalf("checkpoint %s records pod UIDs for %d claims, want 1", raw, stripped)
	}
	if raw, err = json.Marshal(cp); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, want := uidString(restartedPlugin(t, dirs).ClaimView()), "[shared [first] []]"; got != want {
		t.Fatalf("view from an older checkpoint: %s, want %s", got, want)
	}
}
