// Package shiminstall puts libgpushare.so on the host without touching a file any process has loaded.
//
// Pods that use the shim map the host's library (the device plugin bind-mounts it). Copying a new
// library over that file in place, as `cp` does, truncates and rewrites pages that running processes
// have mapped: they can read a mix of two builds or die of SIGBUS. Install instead writes each build to
// a path of its own, named by its content, and then atomically repoints the stable name at it with a
// rename. A process keeps the file it loaded; the next pod gets the new one.
package shiminstall

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// LibraryName is the stable name pods are given: <dir>/libgpushare.so, a symlink to the build in force.
const LibraryName = "libgpushare.so"

// keep is how many builds stay in dir: the one in force and the one before it (for a rollback that
// must not wait for a copy). Older ones go; a pod that mapped one holds its inode, not its name.
const keep = 2

// Result says what Install did.
type Result struct {
	// Path is the versioned file the stable name now points to.
	Path string
	// Changed is false when that build was already in force.
	Changed bool
	// Pruned lists the old build directories removed.
	Pruned []string
}

// Install installs the library src into dir: <dir>/<version>/libgpushare.so, version being the first
// 16 hex digits of its SHA-256, then <dir>/libgpushare.so -> <version>/libgpushare.so by rename.
func Install(src, dir string) (Result, error) {
	data, err := os.ReadFile(src)
	if err != nil {
		return Result{}, fmt.Errorf("reading the shim library: %w", err)
	}
	if len(data) == 0 {
		return Result{}, fmt.Errorf("the shim library %s is empty", src)
	}
	sum := sha256.Sum256(data)
	version := hex.EncodeToString(sum[:8])
	rel := filepath.Join(version, LibraryName)
	link := filepath.Join(dir, LibraryName)
	if cur, err := os.Readlink(link); err == nil && cur == rel && sameContent(filepath.Join(dir, rel), data) {
		return Result{Path: filepath.Join(dir, rel)}, nil
	}
	if err := writeVersion(filepath.Join(dir, version), data); err != nil {
		return Result{}, err
	}
	if err := repoint(link, rel); err != nil {
		return Result{}, err
	}
	pruned, err := prune(dir, version)
	return Result{Path: filepath.Join(dir, rel), Changed: true, Pruned: pruned}, err
}

// writeVersion writes the build into its own directory through a temporary name and a rename, so the
// versioned path never holds a partial file.
func writeVersion(vdir string, data []byte) error {
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return err
	}
	final := filepath.Join(vdir, LibraryName)
	if sameContent(final, data) {
		return nil
	}
	tmp, err := os.CreateTemp(vdir, "."+LibraryName+".tmp-")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o755); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), final)
}

// repoint makes link a symlink to target by renaming a new symlink over it. rename(2) replaces the old
// name atomically whatever it was: an older symlink, or the regular file an in-place installer left,
// whose inode stays intact for every process that has it mapped.
func repoint(link, target string) error {
	tmp := fmt.Sprintf("%s.tmp-%d", link, os.Getpid())
	_ = os.Remove(tmp)
	if err := os.Symlink(target, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, link); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return syncDir(filepath.Dir(link))
}

// prune removes build directories beyond the newest keep, never the one in force.
func prune(dir, current string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	type build struct {
		name string
		mod  int64
	}
	var builds []build
	for _, e := range entries {
		if !e.IsDir() || e.Name() == current || !isVersion(e.Name()) {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		builds = append(builds, build{e.Name(), info.ModTime().UnixNano()})
	}
	sort.Slice(builds, func(i, j int) bool { return builds[i].mod > builds[j].mod })
	var pruned []string
	var errs []error
	for i, b := range builds {
		if i < keep-1 {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, b.name)); err != nil {
			errs = append(errs, err)
			continue
		}
		pruned = append(pruned, b.name)
	}
	return pruned, errors.Join(errs...)
}

func isVersion(name string) bool {
	if len(name) != 16 {
		return false
	}
	return strings.Trim(name, "0123456789abcdef") == ""
}

func sameContent(path string, data []byte) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer func() { _ = f.Close() }()
	got, err := io.ReadAll(f)
	return err == nil && string(got) == string(data)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer func() { _ = d.Close() }()
	return d.Sync()
}
