package dra_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"sync"
	"testing"

	"github.com/go-logr/logr"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/test/testenv"
)

var errDiskFull = errors.New("no space left on device")

// flakyDisk is a checkpoint writer that fails while failing is set and writes for real otherwise.
type flakyDisk struct {
	mu      sync.Mutex
	failing bool
	writes  int
}

func (d *flakyDisk) set(failing bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.failing = failing
}

func (d *flakyDisk) write(path string, data []byte, perm os.FileMode) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.failing {
		return errDiskFull
	}
	d.writes++
	return dra.WriteFileAtomic(path, data, perm)
}

func newPlugin(t *testing.T, dirs pluginDirs, disk *flakyDisk) *dra.KubeletPlugin {
	t.Helper()
	p, err := dra.NewKubeletPlugin(nodeName, dirs.config(), dpConfig, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	p.Update(mixedNode())
	if disk != nil {
		dra.SetCheckpointWriter(p, disk.write)
	}
	return p
}

// onDisk is what a restarted agent reads from the checkpoint: the claims it holds.
func onDisk(t *testing.T, dirs pluginDirs) []types.UID {
	t.Helper()
	return newPlugin(t, dirs, nil).Prepared()
}

func getClaim(t *testing.T, ctx context.Context, c client.Client, name string) *resourcev1.ResourceClaim {
	t.Helper()
	var claim resourcev1.ResourceClaim
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &claim); err != nil {
		t.Fatal(err)
	}
	return &claim
}

func prepareOne(ctx context.Context, p *dra.KubeletPlugin, claim *resourcev1.ResourceClaim) error {
	res, err := p.PrepareResourceClaims(ctx, []*resourcev1.ResourceClaim{claim})
	if err != nil {
		return err
	}
	return res[claim.UID].Err
}

func unprepareOne(ctx context.Context, p *dra.KubeletPlugin, claim *resourcev1.ResourceClaim) error {
	res, err := p.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{
		NamespacedName: types.NamespacedName{Namespace: claim.Namespace, Name: claim.Name}, UID: claim.UID}})
	if err != nil {
		return err
	}
	return res[claim.UID]
}

// A failed checkpoint write fails the kubelet's call and changes nothing; the kubelet's retry writes it.
func TestAFailedCheckpointWriteIsWrittenOnTheKubeletsRetry(t *testing.T) {
	ctx := context.Background()
	env := testenv.StartForTest(t)
	c := env.Client
	heldClaim(t, ctx, c, "first", dra.DriverName, nodeName, "gpu-5")
	heldClaim(t, ctx, c, "second", dra.DriverName, nodeName, "gpu-5")
	first, second := getClaim(t, ctx, c, "first"), getClaim(t, ctx, c, "second")

	t.Run("prepare", func(t *testing.T) {
		dirs := newPluginDirs(t)
		disk := &flakyDisk{failing: true}
		p := newPlugin(t, dirs, disk)
		if err := prepareOne(ctx, p, first); !errors.Is(err, errDiskFull) {
			t.Fatalf("prepare with the checkpoint unwritable = %v, want the write's error", err)
		}
		if got := p.Prepared(); len(got) != 0 {
			t.Errorf("the plugin records %v although its checkpoint was not written", got)
		}
		if _, err := os.Stat(dra.CDISpecPath(dirs.cdi, first.UID)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a CDI spec is left for a claim whose preparation failed: %v", err)
		}

		disk.set(false)
		if err := prepareOne(ctx, p, first); err != nil {
			t.Fatalf("the kubelet's retry = %v", err)
		}
		if got := onDisk(t, dirs); !slices.Equal(got, []types.UID{first.UID}) {
			t.Fatalf("checkpoint after the retry holds %v, want [%s]", got, first.UID)
		}
		// After a restart, the device stays the first claim's.
		if err := prepareOne(ctx, newPlugin(t, dirs, nil), second); !errors.Is(err, dra.ErrDeviceInUse) {
			t.Errorf("a second claim on the device after a restart = %v, want ErrDeviceInUse", err)
		}
	})

	t.Run("unprepare", func(t *testing.T) {
		dirs := newPluginDirs(t)
		disk := &flakyDisk{}
		p := newPlugin(t, dirs, disk)
		if err := prepareOne(ctx, p, first); err != nil {
			t.Fatal(err)
		}
		disk.set(true)
		if err := unprepareOne(ctx, p, first); !errors.Is(err, errDiskFull) {
			t.Fatalf("unprepare with the checkpoint unwritable = %v, want the write's error", err)
		}
		if got := p.Prepared(); !slices.Equal(got, []types.UID{first.UID}) {
			t.Errorf("the plugin records %v after a failed unprepare, want the claim still there as on disk", got)
		}

		disk.set(false)
		if err := unprepareOne(ctx, p, first); err != nil {
			t.Fatalf("the kubelet's retry = %v", err)
		}
		if got := onDisk(t, dirs); len(got) != 0 {
			t.Fatalf("checkpoint after the retry holds %v, want none", got)
		}
		// After a restart, the freed device is prepared for another claim.
		if err := prepareOne(ctx, newPlugin(t, dirs, nil), second); err != nil {
			t.Errorf("a second claim on the freed device after a restart = %v", err)
		}
	})
}

// Entries of claims deleted while nothing unprepared them (the agent was down) are forgotten on start:
// the claim is gone, or its name now belongs to a new claim (another UID). A claim still there stays.
func TestTheKubeletPluginForgetsClaimsThatAreGoneOnStart(t *testing.T) {
	ctx := context.Background()
	env := testenv.StartForTest(t)
	c := env.Client
	heldClaim(t, ctx, c, "deleted", dra.DriverName, nodeName, "gpu-5")
	heldClaim(t, ctx, c, "recreated", dra.DriverName, nodeName, "gpu-3-timeslicing-0")
	heldClaim(t, ctx, c, "kept", dra.DriverName, nodeName, "gpu-1-mps-0")
	deleted, recreated, kept := getClaim(t, ctx, c, "deleted"), getClaim(t, ctx, c, "recreated"), getClaim(t, ctx, c, "kept")

	dirs := newPluginDirs(t)
	p := newPlugin(t, dirs, nil)
	for _, claim := range []*resourcev1.ResourceClaim{deleted, recreated, kept} {
		if err := prepareOne(ctx, p, claim); err != nil {
			t.Fatalf("claim %s: %v", claim.Name, err)
		}
	}

	// The agent stops; meanwhile one claim is deleted, another deleted and created again under its name.
	for _, claim := range []*resourcev1.ResourceClaim{deleted, recreated} {
		if err := c.Delete(ctx, claim); err != nil {
			t.Fatal(err)
		}
	}
	heldClaim(t, ctx, c, "recreated", dra.DriverName, nodeName, "gpu-3-timeslicing-0")
	heldClaim(t, ctx, c, "successor", dra.DriverName, nodeName, "gpu-5")
	successor, again := getClaim(t, ctx, c, "successor"), getClaim(t, ctx, c, "recreated")
	if again.UID == recreated.UID {
		t.Fatal("the claim created again has its old UID")
	}

	restarted := newPlugin(t, dirs, nil)
	// What the stale entries did before they were forgotten: the freed devices are refused.
	if err := prepareOne(ctx, restarted, successor); !errors.Is(err, dra.ErrDeviceInUse) {
		t.Fatalf("before the stale entries are forgotten, a claim on a freed device = %v, want ErrDeviceInUse", err)
	}
	runPlugin(t, ctx, env, restarted)

	// Start forgot them before it served.
	if got := restarted.Prepared(); !slices.Equal(got, []types.UID{kept.UID}) {
		t.Fatalf("prepared after the start = %v, want only the claim still there (%s)", got, kept.UID)
	}
	if got := onDisk(t, dirs); !slices.Equal(got, []types.UID{kept.UID}) {
		t.Errorf("checkpoint after the start holds %v, want only %s", got, kept.UID)
	}
	for _, claim := range []*resourcev1.ResourceClaim{deleted, recreated} {
		if _, err := os.Stat(dra.CDISpecPath(dirs.cdi, claim.UID)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the CDI spec of the forgotten claim %s is still there: %v", claim.Name, err)
		}
	}
	if _, err := os.Stat(dra.CDISpecPath(dirs.cdi, kept.UID)); err != nil {
		t.Errorf("the CDI spec of the claim still there: %v", err)
	}
	for _, claim := range []*resourcev1.ResourceClaim{successor, again} {
		if err := prepareOne(ctx, restarted, claim); err != nil {
			t.Errorf("claim %s on a freed device: %v", claim.Name, err)
		}
	}
}

// A claim that cannot be looked up is kept: not knowing is not "gone".
func TestTheKubeletPluginKeepsClaimsItCannotLookUp(t *testing.T) {
	ctx := context.Background()
	env := testenv.StartForTest(t)
	heldClaim(t, ctx, env.Client, "held", dra.DriverName, nodeName, "gpu-5")
	held := getClaim(t, ctx, env.Client, "held")
	dirs := newPluginDirs(t)
	p := newPlugin(t, dirs, nil)
	if err := prepareOne(ctx, p, held); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, held); err != nil {
		t.Fatal(err)
	}
	// A client no API server answers as it should: every lookup fails.
	cfg := *env.Config
	cfg.Host = "https://127.0.0.1:1"
	unreachable, err := kubernetes.NewForConfig(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := p.ForgetGoneClaims(ctx, unreachable); err == nil || n != 0 {
		t.Errorf("looking up through an unreachable API server = %d forgotten, %v; want none and an error", n, err)
	}
	if got := p.Prepared(); !slices.Equal(got, []types.UID{held.UID}) {
		t.Errorf("prepared = %v, want the claim kept", got)
	}
	// Once the API server answers, the claim is found gone.
	kube, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := p.ForgetGoneClaims(ctx, kube); err != nil || n != 1 {
		t.Errorf("ForgetGoneClaims = %d, %v; want 1 forgotten", n, err)
	}
}
