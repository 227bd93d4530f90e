package podpid

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, &env) }

// writeCgroup fakes /proc/<pid>/cgroup under root.
func writeCgroup(t *testing.T, root string, pid int32, content string) {
	t.Helper()
	dir := filepath.Join(root, fmt.Sprint(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestUIDOfReadsThePodFromEitherCgroupDriver(t *testing.T) {
	root := t.TempDir()
	const uid = "1b2c3d4e-5f60-4a7b-8c9d-0e1f2a3b4c5d"
	cases := []struct {
		name    string
		cgroup  string
		wantUID string
	}{
		{"cgroup v2, systemd driver", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_5f60_4a7b_8c9d_0e1f2a3b4c5d.slice/cri-containerd-abc.scope\n", uid},
		{"cgroup v1, cgroupfs driver", "12:memory:/kubepods/besteffort/pod1b2c3d4e-5f60-4a7b-8c9d-0e1f2a3b4c5d/0123456789abcdef\n11:cpu:/kubepods/besteffort/pod1b2c3d4e-5f60-4a7b-8c9d-0e1f2a3b4c5d/0123456789abcdef\n", uid},
		{"a host process", "0::/system.slice/sshd.service\n", ""},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pid := int32(100 + i)
			writeCgroup(t, root, pid, tc.cgroup)
			got, ok := UIDOf(root, pid)
			if got != tc.wantUID || ok != (tc.wantUID != "") {
				t.Errorf("UIDOf = %q, %v; want %q", got, ok, tc.wantUID)
			}
		})
	}
	if _, ok := UIDOf(root, 999); ok {
		t.Error("a pid without a /proc entry (an exited process) was given a pod")
	}
}

func createPod(t *testing.T, name, node string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}
	if err := env.Client.Create(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	// At once: with no kubelet, a pod bound to a node would stay terminating and keep its name from the
	// next run of the test (-count).
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), p, client.GracePeriodSeconds(0)) })
	return p
}

func cgroupOf(p *corev1.Pod) string {
	return fmt.Sprintf("0::/kubepods.slice/kubepods-pod%s.slice/cri-containerd-x.scope\n", p.UID)
}

func TestResolverNamesClientPodsOnItsNodeOnly(t *testing.T) {
	root := t.TempDir()
	mine := createPod(t, "trainer", "node-a")
	other := createPod(t, "elsewhere", "node-b")
	writeCgroup(t, root, 10, cgroupOf(mine))
	writeCgroup(t, root, 11, cgroupOf(other))
	writeCgroup(t, root, 12, "0::/system.slice/host.service\n")

	r := &Resolver{Reader: env.Client, NodeName: "node-a", ProcRoot: root}
	got := r.Names(context.Background(), []int32{10, 11, 12})
	if got[10] != "default/trainer" {
		t.Errorf("pid 10 named %q, want default/trainer", got[10])
	}
	if name, ok := got[11]; ok {
		t.Errorf("pid 11 runs in a pod of another node, but was named %q", name)
	}
	if name, ok := got[12]; ok {
		t.Errorf("a host process was named %q", name)
	}
}

func TestResolverListsAgainOnlyForAnUnknownPodAndNotTooOften(t *testing.T) {
	root := t.TempDir()
	first := createPod(t, "first", "node-c")
	writeCgroup(t, root, 20, cgroupOf(first))
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC))
	r := &Resolver{Reader: env.Client, NodeName: "node-c", ProcRoot: root, MinRelist: time.Hour, Clock: clk}
	if got := r.Names(context.Background(), []int32{20}); got[20] != "default/first" {
		t.Fatalf("pid 20 named %q", got[20])
	}

	second := createPod(t, "second", "node-c")
	writeCgroup(t, root, 21, cgroupOf(second))
	if got := r.Names(context.Background(), []int32{20, 21}); got[21] != "" {
		t.Errorf("listed again within MinRelist: pid 21 named %q", got[21])
	}
	clk.SetTime(clk.Now().Add(time.Hour))
	if got := r.Names(context.Background(), []int32{20, 21}); got[21] != "default/second" || got[20] != "default/first" {
		t.Errorf("after MinRelist an unknown pod was not looked up: %v", got)
	}
}
