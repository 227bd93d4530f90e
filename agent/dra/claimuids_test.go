package dra_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/gpusharing/gpusharing/agent/dra"
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
	ctx, env := draCluster(t)
	c := env.Client
	shared := sizedHeldClaim(t, ctx, c, "shared", nodeName, "gpu-0-sized", "8Gi", "first")
	dirs := newPluginDirs(t)
	p := restartedPlugin(t, dirs)
	runPlugin(t, ctx, env, p)
	if err := prepareOne(ctx, p, shared); err != nil {
		t.Fatal(err)
	}
	if got, want := uidString(restartedPlugin(t, dirs).ClaimView()), "[shared [first] [uid-first]]"; got != want {
		t.Fatalf("view from the checkpoint alone: %s, want %s", got, want)
	}
	shared = getClaim(t, ctx, c, "shared")
	reserve(shared, "first", "second")
	if err := c.Status().Update(ctx, shared); err != nil {
		t.Fatal(err)
	}
	before := p.ClaimView().SyncedAt
	p.RequestClaimSync()
	wait.UntilState(t, 30*time.Second, func() (bool, string) {
		v := p.ClaimView()
		return v.SyncedAt.After(before) && uidString(v) == "[shared [first second] [uid-first uid-second]]", uidString(v)
	}, "the second pod's UID in the view")
}

// A checkpoint written before pod UIDs were recorded still reads: its claims have their pod names and no
// UIDs until the API server is read.
func TestACheckpointWithoutPodUIDsReadsWithNames(t *testing.T) {
	ctx, env := draCluster(t)
	c := env.Client
	shared := sizedHeldClaim(t, ctx, c, "shared", nodeName, "gpu-0-sized", "8Gi", "first")
	dirs := newPluginDirs(t)
	p := restartedPlugin(t, dirs)
	runPlugin(t, ctx, env, p)
	if err := prepareOne(ctx, p, shared); err != nil {
		t.Fatal(err)
	}
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
