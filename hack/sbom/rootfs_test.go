package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The images' bases take only pinned Debian packages: hack/debian-rootfs.sh refuses a name without a
// version before it downloads anything.
func TestImageBasesTakeOnlyPinnedPackages(t *testing.T) {
	tmp := t.TempDir()
	cmd := exec.Command(filepath.Join("..", "debian-rootfs.sh"), filepath.Join(tmp, "rootfs"), "libc6=2.36-9+deb12u14", "busybox-static")
	cmd.Env = append(cmd.Environ(), "DEB_CACHE="+filepath.Join(tmp, "debs"))
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("debian-rootfs.sh took an unpinned package:\n%s", out)
	}
	if !strings.Contains(string(out), "busybox-static is not pinned: want NAME=VERSION") {
		t.Errorf("the refusal does not name the unpinned package:\n%s", out)
	}
}
