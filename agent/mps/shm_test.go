package mps

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpusharing/gpusharing/agent/outcome"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/fakebin"
)

const otherUUID = "GPU-0000bbbb-0000-0000-0000-000000000000"

// testShmSize is not a whole number of pages, so the test also pins the rounding.
const testShmSize = 16<<20 + 1

// needRoot skips a test that mounts: only root (CAP_SYS_ADMIN) mounts a tmpfs and unshares a mount
// namespace. CI runs as root.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting the MPS tmpfs and unsharing a mount namespace need root; run the tests as root to cover them")
	}
}

// shmFixture is a fixture whose manager starts daemons through the launcher, the test binary itself
// (TestMain), with the fake daemon writing a marker into the /dev/shm it sees.
func shmFixture(t *testing.T) (*fixture, string) {
	needRoot(t)
	marker := "gpusharing-mps-test-" + strconv.Itoa(os.Getpid())
	t.Setenv(fakebin.ShmMarkerEnv, marker)
	t.Cleanup(func() {
		// A marker in the machine's own /dev/shm means a daemon escaped its namespace: fail, and tidy up.
		if _, err := os.Stat(filepath.Join("/dev/shm", marker)); err == nil {
			t.Errorf("a fake MPS daemon wrote into the host's /dev/shm, not its GPU's tmpfs")
			_ = os.Remove(filepath.Join("/dev/shm", marker))
		}
	})
	f := newFixture(t)
	f.m = f.isolatedManager(t, testShmSize)
	return f, marker
}

func (f *fixture) isolatedManager(t *testing.T, size int64) *Manager {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	m := f.manager()
	m.cfg.Launcher, m.cfg.ShmSize = self, size
	return m
}

// wantTmpfs fails unless dir is a tmpfs mount point of size bytes, mode 1777, mounted once.
func wantTmpfs(t *testing.T, dir string, size int64) {
	t.Helper()
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type != unix.TMPFS_MAGIC {
		t.Fatalf("%s has file system type %#x, want a tmpfs", dir, fs.Type)
	}
	if got := int64(fs.Blocks) * fs.Bsize; got != size {
		t.Errorf("%s is a tmpfs of %d bytes, want the cap %d", dir, got, size)
	}
	if n := mountsAt(t, dir); n != 1 {
		t.Errorf("%s is mounted %d times, want once", dir, n)
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o777 || st.Mode()&os.ModeSticky == 0 {
		t.Errorf("%s mode %v (%v), want 1777 as /dev/shm", dir, st.Mode(), err)
	}
}

// mountsAt counts the mounts at dir in the test's mount namespace.
func mountsAt(t *testing.T, dir string) int {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			n++
		}
	}
	return n
}

func readMarker(t *testing.T, dir, marker string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, marker))
	if os.IsNotExist(err) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(data))
}

func TestEachGPUsDaemonSeesItsOwnSizeCappedTmpfsAsDevShm(t *testing.T) {
	f, marker := shmFixture(t)
	ctx := context.Background()
	for _, uuid := range []string{gpuUUID, otherUUID} {
		if _, err := f.m.Ensure(ctx, uuid, settings); err != nil {
			t.Fatalf("Ensure %s: %v", uuid, err)
		}
	}
	page := int64(os.Getpagesize())
	for _, uuid := range []string{gpuUUID, otherUUID} {
		dir := f.m.ShmDir(uuid)
		wantTmpfs(t, dir, (testShmSize+page-1)/page*page)
		// The daemon wrote its GPU's uuid into the /dev/shm it saw: it must be this GPU's tmpfs.
		if got := readMarker(t, dir, marker); got != uuid {
			t.Errorf("marker in %s is %q, want %s's daemon's", dir, got, uuid)
		}
		st, _ := f.m.Status(uuid)
		if on, err := f.m.onItsShm(key{gpu: uuid}, st.PID); err != nil || !on {
			t.Errorf("daemon %d of %s: /dev/shm is its GPU's tmpfs = %v (%v), want true", st.PID, uuid, on, err)
		}
	}
	if _, err := os.Stat(filepath.Join(f.root, "shm")); !os.IsNotExist(err) {
		t.Errorf("a node-wide shm directory exists (%v), want none", err)
	}
}

func TestAFullTmpfsStopsAtItsCap(t *testing.T) {
	f, _ := shmFixture(t)
	if _, err := f.m.Ensure(context.Background(), gpuUUID, settings); err != nil {
		t.Fatal(err)
	}
	// What a pod filling /dev/shm does: it gets ENOSPC at the cap, and the other GPU is not touched.
	big := make([]byte, 2*testShmSize)
	err := os.WriteFile(filepath.Join(f.m.ShmDir(gpuUUID), "fill"), big, 0o644)
	if !errors.Is(err, unix.ENOSPC) {
		t.Errorf("writing %d bytes into a %d-byte tmpfs: %v, want ENOSPC", len(big), testShmSize, err)
	}
}

func TestStopUnmountsTheTmpfsOnlyOnceTheDaemonQuitWithNoClient(t *testing.T) {
	f, _ := shmFixture(t)
	ctx := context.Background()
	st, err := f.m.Ensure(ctx, gpuUUID, settings)
	if err != nil {
		t.Fatal(err)
	}
	dir := f.m.ShmDir(gpuUUID)
	pipe := f.m.PipeDir(gpuUUID)
	write(t, filepath.Join(pipe, "servers"), "4100\n")
	write(t, filepath.Join(pipe, "clients.4100"), "4200\n")
	err = f.m.Stop(ctx, gpuUUID)
	if o, ok := outcome.As(err); !ok || o.Reason != v1alpha1.ReasonGPUBusy {
		t.Fatalf("Stop with a client: %v, want GPUBusy", err)
	}
	if mounted, _, err := tmpfsAt(dir); err != nil || !mounted {
		t.Fatalf("the tmpfs is gone (%v) while a client is connected", err)
	}

	if err := os.Remove(filepath.Join(pipe, "clients.4100")); err != nil {
		t.Fatal(err)
	}
	if err := f.m.Stop(ctx, gpuUUID); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if f.m.Alive(st.PID) {
		t.Errorf("daemon %d still runs", st.PID)
	}
	if n := mountsAt(t, dir); n != 0 {
		t.Errorf("%s still mounted %d times after Stop", dir, n)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s still exists after Stop (%v)", dir, err)
	}
	// A GPU with nothing left costs nothing and fails nothing.
	if err := f.m.Stop(ctx, gpuUUID); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestARestartedAgentAdoptsTheMountedTmpfs(t *testing.T) {
	f, marker := shmFixture(t)
	ctx := context.Background()
	first, err := f.m.Ensure(ctx, gpuUUID, settings)
	if err != nil {
		t.Fatal(err)
	}
	f.fake.Calls(t)
	dir := f.m.ShmDir(gpuUUID)
	write(t, filepath.Join(dir, "client-segment"), "in use")

	// Same size: nothing is mounted again, the daemon and its memory are kept.
	restarted := f.isolatedManager(t, testShmSize)
	st, err := restarted.Ensure(ctx, gpuUUID, settings)
	if err != nil {
		t.Fatal(err)
	}
	if st.PID != first.PID {
		t.Errorf("restarted agent runs daemon %d, want the adopted %d", st.PID, first.PID)
	}
	for _, c := range f.fake.Calls(t) {
		if strings.Contains(c, " -d") {
			t.Errorf("restarted agent started a daemon: %q", c)
		}
	}
	page := int64(os.Getpagesize())
	wantTmpfs(t, dir, (testShmSize+page-1)/page*page)
	if got := readMarker(t, dir, "client-segment"); got != "in use" {
		t.Errorf("a client's segment reads %q after the restart, want it kept", got)
	}
	if got := readMarker(t, dir, marker); got != gpuUUID {
		t.Errorf("the daemon's marker reads %q after the restart, want %s", got, gpuUUID)
	}

	// A new --mps-shm-size resizes the adopted tmpfs in place, under the running daemon.
	resized := f.isolatedManager(t, 32<<20)
	if st, err := resized.Ensure(ctx, gpuUUID, settings); err != nil || st.PID != first.PID {
		t.Fatalf("Ensure with a new size: pid %d, %v; want the adopted %d", st.PID, err, first.PID)
	}
	wantTmpfs(t, dir, 32<<20)
	if on, err := resized.onItsShm(key{gpu: gpuUUID}, first.PID); err != nil || !on {
		t.Errorf("after the resize the daemon's /dev/shm is its tmpfs = %v (%v), want true", on, err)
	}
}

// An agent before per-GPU tmpfs started daemons on the node's shared directory. The new agent must not
// adopt such a daemon as it is (clients mounting the GPU's tmpfs could not reach it): it restarts it once
// no client is connected.
func TestADaemonOfAnEarlierAgentIsRestartedOntoItsTmpfs(t *testing.T) {
	f, _ := shmFixture(t)
	ctx := context.Background()
	old := f.manager() // no launcher: the daemon shares the test's /dev/shm, as under an earlier agent
	t.Setenv(fakebin.ShmMarkerEnv, "")
	first, err := old.Ensure(ctx, gpuUUID, settings)
	if err != nil {
		t.Fatal(err)
	}
	pipe := f.m.PipeDir(gpuUUID)
	write(t, filepath.Join(pipe, "servers"), "4100\n")
	write(t, filepath.Join(pipe, "clients.4100"), "4200\n")
	f.fake.Calls(t)

	_, err = f.m.Ensure(ctx, gpuUUID, settings)
	if o, ok := outcome.As(err); !ok || o.Reason != v1alpha1.ReasonGPUBusy || !strings.Contains(o.Message, "/dev/shm") {
		t.Fatalf("Ensure with a client on the old daemon: %v, want GPUBusy naming /dev/shm", err)
	}
	if !f.m.Alive(first.PID) {
		t.Fatalf("the old daemon %d was stopped under its client", first.PID)
	}

	if err := os.Remove(filepath.Join(pipe, "clients.4100")); err != nil {
		t.Fatal(err)
	}
	st, err := f.m.Ensure(ctx, gpuUUID, settings)
	if err != nil {
		t.Fatal(err)
	}
	if st.PID == first.PID || f.m.Alive(first.PID) {
		t.Errorf("daemon %d (old %d, alive %v), want the old one quit and a new one started", st.PID, first.PID, f.m.Alive(first.PID))
	}
	if on, err := f.m.onItsShm(key{gpu: gpuUUID}, st.PID); err != nil || !on {
		t.Errorf("the new daemon's /dev/shm is its tmpfs = %v (%v), want true", on, err)
	}
}

func TestTheLauncherRefusesADirectoryThatIsNotATmpfs(t *testing.T) {
	if err := Launch([]string{"relative/shm", "/bin/true"}, nil); err != ErrLaunchUsage {
		t.Errorf("Launch with a relative directory: %v, want ErrLaunchUsage", err)
	}
	if err := Launch([]string{"/run/x"}, nil); err != ErrLaunchUsage {
		t.Errorf("Launch without a program: %v, want ErrLaunchUsage", err)
	}
	needRoot(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	plain := t.TempDir()
	out, err := exec.Command(self, LaunchCommand, plain, "/bin/true").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "is not a tmpfs") {
		t.Errorf("mps-launch on a plain directory: %v, %q; want a refusal naming the tmpfs", err, out)
	}
}

// Without a launcher (the command-sequence tests) nothing is mounted: shm/ is a plain directory, so the
// fixture's other tests need no privileges.
func TestWithoutALauncherNothingIsMounted(t *testing.T) {
	f := newFixture(t)
	if _, err := f.m.Ensure(context.Background(), gpuUUID, settings); err != nil {
		t.Fatal(err)
	}
	if mounted, _, err := tmpfsAt(f.m.ShmDir(gpuUUID)); err != nil || mounted {
		t.Errorf("shm directory mounted = %v (%v), want a plain directory", mounted, err)
	}
	if !reflect.DeepEqual(f.fake.Calls(t), f.startCalls(settingsCalls)) {
		t.Errorf("unexpected command sequence")
	}
}
