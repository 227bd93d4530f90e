package mps

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpusharing/gpusharing/agent/outcome"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/fakebin"
)

// tenantEnv is what every command of a namespace's daemon carries, as the fake logs it.
func (f *fixture) tenantEnv(ns string) string {
	dir := filepath.Join(f.root, gpuUUID, "ns", ns)
	return " CUDA_MPS_PIPE_DIRECTORY=" + filepath.Join(dir, "pipe") + " CUDA_MPS_LOG_DIRECTORY=" + filepath.Join(dir, "log")
}

func (f *fixture) ensureTenant(t *testing.T, ns string, s Settings) Status {
	t.Helper()
	st, err := f.m.EnsureTenant(context.Background(), gpuUUID, ns, s)
	if err != nil {
		t.Fatalf("EnsureTenant %s: %v", ns, err)
	}
	return st
}

func TestEachNamespaceOnAGPUGetsADaemonWithItsOwnPipeAndTmpfs(t *testing.T) {
	f, marker := shmFixture(t)
	if _, err := f.m.Ensure(context.Background(), gpuUUID, settings); err != nil {
		t.Fatal(err)
	}
	gpu, _ := f.m.Status(gpuUUID)
	a, b := f.ensureTenant(t, "team-a", settings), f.ensureTenant(t, "team-b", settings)
	if a.PID == b.PID || a.PID == gpu.PID || b.PID == gpu.PID {
		t.Fatalf("daemons %d (team-a), %d (team-b), %d (GPU): want three", a.PID, b.PID, gpu.PID)
	}
	page := int64(os.Getpagesize())
	devs := map[uint64]string{}
	for _, ns := range []string{"team-a", "team-b"} {
		k := key{gpu: gpuUUID, ns: ns}
		dir := f.m.TenantShmDir(gpuUUID, ns)
		if want := filepath.Join(f.root, gpuUUID, "ns", ns, "shm"); dir != want {
			t.Errorf("%s's shm directory %s, want %s", ns, dir, want)
		}
		wantTmpfs(t, dir, (testShmSize+page-1)/page*page)
		if got := readMarker(t, dir, marker); got != gpuUUID {
			t.Errorf("%s: marker %q in its tmpfs, want its daemon's (%s)", ns, got, gpuUUID)
		}
		st, _ := f.m.TenantStatus(gpuUUID, ns)
		if on, err := f.m.onItsShm(k, st.PID); err != nil || !on {
			t.Errorf("%s's daemon %d: /dev/shm is its own tmpfs = %v (%v), want true", ns, st.PID, on, err)
		}
		var fs unix.Stat_t
		if err := unix.Stat(dir, &fs); err != nil {
			t.Fatal(err)
		}
		if other, ok := devs[fs.Dev]; ok {
			t.Errorf("%s and %s share one tmpfs", ns, other)
		}
		devs[fs.Dev] = ns
	}
	if got, want := f.m.Tenants(), []Tenant{{gpuUUID, "team-a"}, {gpuUUID, "team-b"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("Tenants() = %v, want %v", got, want)
	}
}

// The pods of namespace team-b get exactly what share.ContainerEdits gives an MPS share of team-b: the
// probe (probe_test.go) is such a container, run as root, that tries every socket it can see, writes
// its /dev/shm full and deletes every file it can. Namespace team-a's daemon, its socket, its pid file and
// its clients' shared memory come out untouched, and the GPU daemon of device plugin pods is not reached.
func TestATenantCannotReachAnotherNamespacesDaemonOrSharedMemory(t *testing.T) {
	f, _ := shmFixture(t)
	shortRoot(t, f)
	ctx := context.Background()
	if _, err := f.m.Ensure(ctx, gpuUUID, settings); err != nil {
		t.Fatal(err)
	}
	f.ensureTenant(t, "team-a", settings)
	f.ensureTenant(t, "team-b", settings)

	// The real daemon listens on "control" in its pipe directory; these stand-ins answer with their name.
	accepted := map[string]*atomic.Int32{}
	for name, pipe := range map[string]string{"gpu": f.m.PipeDir(gpuUUID), "team-a": f.m.TenantPipeDir(gpuUUID, "team-a"), "team-b": f.m.TenantPipeDir(gpuUUID, "team-b")} {
		accepted[name] = serveControl(t, filepath.Join(pipe, "control"), name)
	}
	aShm := f.m.TenantShmDir(gpuUUID, "team-a")
	write(t, filepath.Join(aShm, "cuda.shm.team-a"), "team-a's client memory")
	var before unix.Statfs_t
	if err := unix.Statfs(aShm, &before); err != nil {
		t.Fatal(err)
	}

	edits, err := share.ContainerEdits(share.Config{MPSRoot: f.root}, []share.Device{{ID: share.ReplicaID(gpuUUID, 1), Kind: share.KindMPS,
		GPUUUID: gpuUUID, VisibleUUID: gpuUUID, MPS: &share.MPSLimits{ActiveThreadPercentage: 50}, MPSNamespace: "team-b"}})
	if err != nil {
		t.Fatal(err)
	}
	args := []string{probeCommand, t.TempDir()}
	for _, m := range edits.Mounts {
		args = append(args, m.HostPath+":"+m.ContainerPath)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(self, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the probe failed: %v\n%s", err, stderr.String())
	}

	var connects, seen []string
	var fill string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		kind, rest, _ := strings.Cut(sc.Text(), " ")
		switch kind {
		case "connect":
			connects = append(connects, rest)
		case "file":
			seen = append(seen, rest)
		case "fill":
			fill = rest
		}
	}
	if want := []string{share.ContainerMPSPipeDir + "/control team-b"}; !reflect.DeepEqual(connects, want) {
		t.Errorf("the probe's connections: %q, want only its own namespace's daemon %q", connects, want)
	}
	for _, s := range seen {
		if strings.Contains(s, "team-a") || strings.Contains(s, gpuUUID) {
			t.Errorf("team-b's container sees %s", s)
		}
	}
	page := int64(os.Getpagesize())
	if n, _, _ := strings.Cut(fill, " "); !strings.Contains(fill, "no space left on device") || n == "" || mustAtoi(t, n) > (testShmSize+page-1)/page*page {
		t.Errorf("filling /dev/shm: %q, want ENOSPC within its own %d-byte cap", fill, testShmSize)
	}

	for name, n := range accepted {
		if got := n.Load(); name != "team-b" && got != 0 {
			t.Errorf("%s's daemon socket was connected to %d times by team-b's container", name, got)
		}
	}
	if data, err := os.ReadFile(filepath.Join(aShm, "cuda.shm.team-a")); err != nil || string(data) != "team-a's client memory" {
		t.Errorf("team-a's shared memory reads %q (%v) after team-b's probe, want it unchanged", data, err)
	}
	var after unix.Statfs_t
	if err := unix.Statfs(aShm, &after); err != nil {
		t.Fatal(err)
	}
	if after.Bfree != before.Bfree {
		t.Errorf("team-a's tmpfs has %d free blocks after team-b filled its own, want %d", after.Bfree, before.Bfree)
	}
	for _, p := range []string{filepath.Join(f.m.TenantPipeDir(gpuUUID, "team-a"), PIDFile), filepath.Join(f.m.TenantPipeDir(gpuUUID, "team-a"), "control")} {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("team-a's %s is gone after team-b's probe: %v", filepath.Base(p), err)
		}
	}
	// The probe did delete what it could reach: its own namespace's pid file.
	if _, err := os.Stat(filepath.Join(f.m.TenantPipeDir(gpuUUID, "team-b"), PIDFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("team-b's own pid file survived the probe (%v): the probe did not run its deletes", err)
	}
	if _, err := f.m.clients(ctx, key{gpu: gpuUUID, ns: "team-a"}); err != nil {
		t.Errorf("team-a's daemon no longer answers after team-b's probe: %v", err)
	}
}

// shortRoot moves the fixture's MPS root to a short path: a Unix socket's path must fit in 108 bytes.
func shortRoot(t *testing.T, f *fixture) {
	t.Helper()
	dir, err := os.MkdirTemp("", "mps")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		fakebin.KillDaemons(dir)
		if err := fakebin.UnmountUnder(dir); err != nil {
			t.Error(err)
		}
		_ = os.RemoveAll(dir)
	})
	f.root = dir
	f.m = f.isolatedManager(t, testShmSize)
}

// serveControl listens on path and writes name to every connection; it counts them.
func serveControl(t *testing.T, path, name string) *atomic.Int32 {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	n := &atomic.Int32{}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			_, _ = c.Write([]byte(name + "\n"))
			_ = c.Close()
		}
	}()
	return n
}

func mustAtoi(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestANamespacesDaemonStopsWithItsNamespaceAndTheGPUsWithAllOfThem(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	gpu := f.started(t)
	a, b := f.ensureTenant(t, "team-a", settings), f.ensureTenant(t, "team-b", settings)
	f.fake.Calls(t)

	if err := f.m.StopTenant(ctx, gpuUUID, "team-a"); err != nil {
		t.Fatal(err)
	}
	want := []string{"nvidia-cuda-mps-control <<< get_server_list" + f.tenantEnv("team-a"), "nvidia-cuda-mps-control <<< quit" + f.tenantEnv("team-a")}
	if got := f.fake.Calls(t); !reflect.DeepEqual(got, want) {
		t.Errorf("StopTenant team-a ran %q, want %q", got, want)
	}
	if f.m.Alive(a.PID) || !f.m.Alive(b.PID) || !f.m.Alive(gpu.PID) {
		t.Errorf("after team-a's stop: team-a alive %v, team-b alive %v, GPU alive %v; want false, true, true", f.m.Alive(a.PID), f.m.Alive(b.PID), f.m.Alive(gpu.PID))
	}
	if _, err := os.Stat(filepath.Join(f.root, gpuUUID, "ns", "team-a")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("team-a's directory is left after its daemon quit (%v)", err)
	}
	if got, want := f.m.Tenants(), []Tenant{{gpuUUID, "team-b"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("Tenants() = %v, want %v", got, want)
	}
	if err := f.m.StopTenant(ctx, gpuUUID, "team-a"); err != nil || len(f.fake.Calls(t)) != 0 {
		t.Errorf("a second StopTenant: %v, or it ran commands", err)
	}

	// team-b's client keeps its daemon, and so the GPU's.
	pipe := f.m.TenantPipeDir(gpuUUID, "team-b")
	write(t, filepath.Join(pipe, "servers"), "4100\n")
	write(t, filepath.Join(pipe, "clients.4100"), "5001\n")
	if st, _ := f.m.Status(gpuUUID); st.Clients != 0 {
		t.Fatalf("clients %d before a watch pass counted them", st.Clients)
	}
	f.m.Check(ctx)
	if st, _ := f.m.Status(gpuUUID); st.Clients != 1 {
		t.Errorf("the GPU's status counts %d clients, want team-b's 1", st.Clients)
	}
	err := f.m.Stop(ctx, gpuUUID)
	if o, ok := outcome.As(err); !ok || o.Reason != v1alpha1.ReasonGPUBusy || !strings.Contains(o.Message, "team-b") {
		t.Fatalf("Stop of the GPU with team-b's client: %v, want GPUBusy naming team-b", err)
	}
	if !f.m.Alive(gpu.PID) || !f.m.Alive(b.PID) {
		t.Fatalf("a refused Stop quit a daemon")
	}
	if err := os.Remove(filepath.Join(pipe, "clients.4100")); err != nil {
		t.Fatal(err)
	}
	if err := f.m.Stop(ctx, gpuUUID); err != nil {
		t.Fatal(err)
	}
	if f.m.Alive(gpu.PID) || f.m.Alive(b.PID) || len(f.m.Tenants()) != 0 {
		t.Errorf("after the GPU's Stop: GPU alive %v, team-b alive %v, tenants %v; want none", f.m.Alive(gpu.PID), f.m.Alive(b.PID), f.m.Tenants())
	}
}

func TestANamespaceThatIsNotALabelIsRefused(t *testing.T) {
	f := newFixture(t)
	for _, ns := range []string{"", "..", "a/b", "../../etc"} {
		if _, err := f.m.EnsureTenant(context.Background(), gpuUUID, ns, settings); !errors.Is(err, ErrBadNamespace) {
			t.Errorf("EnsureTenant %q: %v, want ErrBadNamespace", ns, err)
		}
		if err := f.m.StopTenant(context.Background(), gpuUUID, ns); !errors.Is(err, ErrBadNamespace) {
			t.Errorf("StopTenant %q: %v, want ErrBadNamespace", ns, err)
		}
	}
	if got := f.fake.Calls(t); len(got) != 0 {
		t.Errorf("commands ran: %q", got)
	}
}

// New settings reach a namespace's daemon for its later servers; it is not restarted under its clients.
func TestNewSettingsDoNotRestartANamespacesDaemon(t *testing.T) {
	f := newFixture(t)
	first := f.ensureTenant(t, "team-a", settings)
	f.fake.Calls(t)
	st := f.ensureTenant(t, "team-a", Settings{ActiveThreadPercentage: 25})
	if st.PID != first.PID || st.Settings.ActiveThreadPercentage != 25 {
		t.Errorf("status %+v, want daemon %d kept with the new settings", st, first.PID)
	}
	if got, want := f.fake.Calls(t), []string{"nvidia-cuda-mps-control <<< set_default_active_thread_percentage 25" + f.tenantEnv("team-a")}; !reflect.DeepEqual(got, want) {
		t.Errorf("commands %q, want %q", got, want)
	}
}

// A restarted agent finds the namespaces' daemons from their directories and adopts each without a new
// daemon, a quit or a second tmpfs: their clients and shared memory carry on. Adopted, a daemon is
// watched again (restarted when it dies).
func TestARestartedAgentAdoptsTheNamespacesDaemonsWithoutDisturbingTheirClients(t *testing.T) {
	f, _ := shmFixture(t)
	ctx := context.Background()
	first := f.ensureTenant(t, "team-a", settings)
	shm := f.m.TenantShmDir(gpuUUID, "team-a")
	write(t, filepath.Join(shm, "client-segment"), "in use")
	f.fake.Calls(t)

	restarted := f.isolatedManager(t, testShmSize)
	if got, want := restarted.Tenants(), []Tenant{{gpuUUID, "team-a"}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("the restarted agent finds %v, want %v", got, want)
	}
	st, err := restarted.EnsureTenant(ctx, gpuUUID, "team-a", settings)
	if err != nil {
		t.Fatal(err)
	}
	if st.PID != first.PID {
		t.Errorf("restarted agent runs daemon %d, want the adopted %d", st.PID, first.PID)
	}
	want := []string{
		"nvidia-cuda-mps-control <<< set_default_active_thread_percentage 50" + f.tenantEnv("team-a"),
		"nvidia-cuda-mps-control <<< set_default_device_pinned_mem_limit 0 4096M" + f.tenantEnv("team-a"),
	}
	if got := f.fake.Calls(t); !reflect.DeepEqual(got, want) {
		t.Errorf("commands %q, want only the settings re-sent: %q", got, want)
	}
	if n := mountsAt(t, shm); n != 1 {
		t.Errorf("%s mounted %d times after the restart, want once", shm, n)
	}
	if got := readMarker(t, shm, "client-segment"); got != "in use" {
		t.Errorf("a client's segment reads %q after the restart, want it kept", got)
	}

	if err := syscall.Kill(first.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitDead(t, first.PID)
	restarted.Check(ctx)
	if st, _ := restarted.TenantStatus(gpuUUID, "team-a"); st.State != StateRestarting {
		t.Errorf("the adopted daemon's death: state %s, want Restarting", st.State)
	}
}

// A namespace's daemon that died and waits out its backoff is still listed, so a sync whose checkpoint no
// longer wants it quits it rather than leave the watcher to start it again.
func TestADeadNamespaceDaemonInBackoffIsStillListedAndStops(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	st := f.ensureTenant(t, "team-a", settings)
	if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitDead(t, st.PID)
	f.m.Check(ctx)
	if got, want := f.m.Tenants(), []Tenant{{gpuUUID, "team-a"}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("Tenants() with team-a's daemon in backoff = %v, want %v", got, want)
	}
	if err := f.m.StopTenant(ctx, gpuUUID, "team-a"); err != nil {
		t.Fatal(err)
	}
	f.fake.Calls(t)
	f.clock.Step(time.Hour)
	f.m.Check(ctx)
	if got := f.fake.Calls(t); len(got) != 0 || len(f.m.Tenants()) != 0 {
		t.Errorf("a stopped namespace daemon came back: commands %q, tenants %v", got, f.m.Tenants())
	}
}
