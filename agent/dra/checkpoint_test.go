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
	env, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
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
