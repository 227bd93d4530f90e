package podpid

import "testing"

func TestContainerOfReadsPodAndContainerFromEitherCgroupDriver(t *testing.T) {
	root := t.TempDir()
	const uid = "1b2c3d4e-5f60-4a7b-8c9d-0e1f2a3b4c5d"
	const id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	cases := []struct {
		name          string
		cgroup        string
		wantOK        bool
		wantContainer string
	}{
		{"cgroupfs v2", "0::/kubepods/burstable/pod" + uid + "/" + id + "\n", true, id},
		{"systemd v2", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_5f60_4a7b_8c9d_0e1f2a3b4c5d.slice/cri-containerd-" + id + ".scope\n", true, id},
		{"pod-level cgroup", "0::/kubepods/besteffort/pod" + uid + "\n", true, ""},
		{"host process", "0::/system.slice/containerd.service\n", false, ""},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pid := int32(100 + i)
			writeCgroup(t, root, pid, c.cgroup)
			gotUID, gotContainer, ok := ContainerOf(root, pid)
			if ok != c.wantOK || gotContainer != c.wantContainer || (ok && gotUID != uid) {
				t.Errorf("ContainerOf = %q, %q, %v; want %q, %q, %v", gotUID, gotContainer, ok, uid, c.wantContainer, c.wantOK)
			}
		})
	}
	if _, _, ok := ContainerOf(root, 99999); ok {
		t.Error("a pid without /proc entry must not be in a pod")
	}
}
