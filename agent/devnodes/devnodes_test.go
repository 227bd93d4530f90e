package devnodes_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpusharing/gpusharing/agent/devnodes"
	"github.com/gpusharing/gpusharing/agent/devnodes/devnodestest"
)

// A node is handed out only when it is the character device the driver made: a missing node, a file
// in its place, a node of other numbers and a driver that registered no unified memory major are each
// ErrMissing with the path or file that says why.
func TestNodesAreReadAsTheDriverMadeThem(t *testing.T) {
	h, err := devnodestest.Make(t.TempDir(), 2)
	if err != nil {
		t.Skipf("making device nodes needs CAP_MKNOD: %v", err)
	}
	if n, err := h.GPU(1); err != nil || n != (devnodes.Node{Path: "/dev/nvidia1", HostPath: filepath.Join(h.Dev, "nvidia1"), Major: 195, Minor: 1}) {
		t.Fatalf("GPU(1) = %+v, %v", n, err)
	}
	if err := os.Remove(filepath.Join(h.Dev, "nvidia0")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.Dev, "nvidia0"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(h.Dev, "nvidia7"), unix.S_IFCHR|0o666, int(unix.Mkdev(195, 3))); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		err  func() error
		want string
	}{
		{"no node", func() error { _, err := h.GPU(5); return err }, "nvidia5 does not exist"},
		{"a file in its place", func() error { _, err := h.GPU(0); return err }, "nvidia0 is not a character device"},
		{"other numbers", func() error { _, err := h.GPU(7); return err }, "nvidia7 is 195:3, the driver's is 195:7"},
		{"no minor", func() error { _, err := h.GPU(-1); return err }, "minor number is unknown"},
		{"no such MIG instance", func() error { _, err := h.MIG(0, 20, 0); return err }, "lists no gpu0/gi20/access"},
	} {
		if err := tc.err(); !errors.Is(err, devnodes.ErrMissing) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %v saying %q", tc.name, err, devnodes.ErrMissing, tc.want)
		}
	}
	if err := os.WriteFile(filepath.Join(h.Proc, "devices"), []byte("Character devices:\n195 nvidia-frontend\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Control(); !errors.Is(err, devnodes.ErrMissing) || !strings.Contains(err.Error(), "no nvidia-uvm major") {
		t.Errorf("Control without the uvm major: %v", err)
	}
}
