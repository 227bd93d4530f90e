package shiminstall

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// build returns a fake library of one page filled with b.
func build(t *testing.T, dir string, b byte) string {
	t.Helper()
	p := filepath.Join(dir, "src-"+string(rune('a'+b%26)))
	if err := os.WriteFile(p, bytes.Repeat([]byte{b}, os.Getpagesize()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// mapLibrary maps the installed library as the dynamic loader does (a shared, read-only file mapping
// through the stable name), returning the bytes a running process sees.
func mapLibrary(t *testing.T, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	m, err := syscall.Mmap(int(f.Fd()), 0, os.Getpagesize(), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Munmap(m) })
	return m
}

func TestARunningProcessKeepsTheLibraryItLoaded(t *testing.T) {
	src, dir := t.TempDir(), t.TempDir()
	if _, err := Install(build(t, src, 1), dir); err != nil {
		t.Fatal(err)
	}
	loaded := mapLibrary(t, filepath.Join(dir, LibraryName))
	res, err := Install(build(t, src, 2), dir)
	if err != nil || !res.Changed {
		t.Fatalf("second install = %+v, %v", res, err)
	}
	if loaded[0] != 1 || loaded[len(loaded)-1] != 1 {
		t.Errorf("the running process's mapping changed under it: first byte %d, last %d", loaded[0], loaded[len(loaded)-1])
	}
	if now, _ := os.ReadFile(filepath.Join(dir, LibraryName)); now[0] != 2 {
		t.Errorf("the stable name serves build %d, want the new one", now[0])
	}
}

// TestCopyingInPlaceChangesWhatProcessesMapped shows the hazard Install avoids: the old init container's
// `cp` rewrote the mapped file, so a running process saw the new build's bytes (or SIGBUS on a shorter one).
func TestCopyingInPlaceChangesWhatProcessesMapped(t *testing.T) {
	dir := t.TempDir()
	lib := filepath.Join(dir, LibraryName)
	if err := os.WriteFile(lib, bytes.Repeat([]byte{1}, os.Getpagesize()), 0o755); err != nil {
		t.Fatal(err)
	}
	loaded := mapLibrary(t, lib)
	if err := os.WriteFile(lib, bytes.Repeat([]byte{2}, os.Getpagesize()), 0o755); err != nil {
		t.Fatal(err)
	}
	if loaded[0] != 2 {
		t.Fatalf("an in-place rewrite left the mapping at %d: the hazard this package exists for is not reproduced", loaded[0])
	}
	// Install over that old layout: the regular file is replaced by the link, its inode left alone.
	if _, err := Install(build(t, t.TempDir(), 3), dir); err != nil {
		t.Fatal(err)
	}
	if loaded[0] != 2 {
		t.Errorf("installing over the old layout changed a mapping of the old file: %d", loaded[0])
	}
	if target, err := os.Readlink(lib); err != nil || filepath.Dir(target) == "." {
		t.Errorf("%s = %q, %v; want a link into a versioned directory", lib, target, err)
	}
}

func TestInstallingTheSameBuildAgainChangesNothing(t *testing.T) {
	src, dir := t.TempDir(), t.TempDir()
	lib := build(t, src, 1)
	first, err := Install(lib, dir)
	if err != nil || !first.Changed {
		t.Fatalf("first install = %+v, %v", first, err)
	}
	info, _ := os.Lstat(filepath.Join(dir, LibraryName))
	again, err := Install(lib, dir)
	if err != nil || again.Changed || again.Path != first.Path {
		t.Fatalf("second install = %+v, %v; want unchanged at %s", again, err, first.Path)
	}
	if info2, _ := os.Lstat(filepath.Join(dir, LibraryName)); !os.SameFile(info, info2) {
		t.Error("the link was replaced although the build was already in force")
	}
}

func TestOnlyTheBuildInForceAndTheOneBeforeItStay(t *testing.T) {
	src, dir := t.TempDir(), t.TempDir()
	var paths []string
	for b := byte(1); b <= 4; b++ {
		res, err := Install(build(t, src, b), dir)
		if err != nil {
			t.Fatal(err)
		}
		paths = append(paths, res.Path)
		// Distinct modification times order the builds even on coarse clocks.
		old := filepath.Dir(res.Path)
		_ = os.Chtimes(old, timeOf(int(b)), timeOf(int(b)))
	}
	var left []string
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			left = append(left, p)
		}
	}
	if len(left) != 2 || left[0] != paths[2] || left[1] != paths[3] {
		t.Errorf("builds left = %v, want the last two of %v", left, paths)
	}
}

func TestAnEmptyOrMissingLibraryIsRefused(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.so")
	_ = os.WriteFile(empty, nil, 0o644)
	for _, src := range []string{empty, filepath.Join(dir, "missing.so")} {
		if _, err := Install(src, t.TempDir()); err == nil {
			t.Errorf("Install(%s) succeeded", src)
		}
	}
}

func timeOf(hour int) time.Time { return time.Unix(int64(hour)*3600, 0) }
