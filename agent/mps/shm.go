package mps

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/gpusharing/gpusharing/agent/hostpath"
)

// DefaultShmSize caps each MPS GPU's /dev/shm (2 GiB). The daemon itself needs little, but a client
// container's /dev/shm is this tmpfs, and PyTorch DataLoader workers hand every batch to the main
// process through /dev/shm: a cap of a few MiB (Docker's 64 MiB default is the usual "bus error" in
// DataLoader) breaks ordinary training jobs. tmpfs takes memory only as it is written, and the pages are
// charged to the memory cgroup of the pod that writes them, so the cap is a ceiling per GPU, not a
// reservation.
const DefaultShmSize int64 = 2 << 30

// shmMountFlags: shared memory holds data, never programs or devices.
const shmMountFlags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC

// ShmDir is the GPU's shared memory directory: a tmpfs of ShmSize while the GPU runs MPS, which its
// daemon sees as /dev/shm and the device plugin mounts at /dev/shm in the GPU's MPS clients.
func (m *Manager) ShmDir(uuid string) string { return m.shmDir(key{gpu: uuid}) }

// shmDir is a daemon's shared memory directory: the GPU's, or the namespace's on the GPU.
func (m *Manager) shmDir(k key) string {
	if k.ns == "" {
		return hostpath.MPSShmDir(m.cfg.Root, k.gpu)
	}
	return hostpath.MPSTenantShmDir(m.cfg.Root, k.gpu, k.ns)
}

// isolated reports whether daemons get a tmpfs of their own as /dev/shm (a Launcher is configured).
func (m *Manager) isolated() bool { return m.cfg.Launcher != "" }

// mountShm makes the daemon's shm directory a tmpfs of ShmSize. One already mounted there is adopted, and
// resized in place when the size changed: it is a restarted agent's, and the running daemon's /dev/shm
// is a bind of it, so a second tmpfs mounted over it would hide the daemon from every client started
// after the restart.
func (m *Manager) mountShm(k key) error {
	dir := m.shmDir(k)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	mounted, size, err := tmpfsAt(dir)
	if err != nil {
		return err
	}
	want := roundToPage(m.cfg.ShmSize)
	// mode=1777 as /dev/shm always is: client containers may run as any user.
	opts := "mode=1777,size=" + strconv.FormatInt(want, 10)
	switch {
	case !mounted:
		err = unix.Mount("gpusharing-mps-shm", dir, "tmpfs", shmMountFlags, opts)
	case size != want:
		err = unix.Mount("", dir, "", unix.MS_REMOUNT|shmMountFlags, opts)
	}
	if err != nil {
		return fmt.Errorf("mounting a %d-byte tmpfs for the MPS daemon's /dev/shm at %s: %w", want, dir, err)
	}
	return nil
}

// unmountShm removes the daemon's shm directory, unmounting its tmpfs first. Callers run it only once the
// daemon has quit with no client connected: a client container keeps its own bind of the tmpfs (the
// memory lives on until it ends), but no new client can reach it.
func (m *Manager) unmountShm(k key) error {
	dir := m.shmDir(k)
	// A loop, not one call: a tmpfs mounted twice (by hand, or by a bug) must not leave the lower one
	// behind, whose files RemoveAll below would then delete under whoever uses them.
	for range 8 {
		mounted, _, err := tmpfsAt(dir)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if !mounted {
			return os.RemoveAll(dir)
		}
		if err := unix.Unmount(dir, 0); err != nil {
			return fmt.Errorf("unmounting the MPS daemon's /dev/shm at %s: %w", dir, err)
		}
	}
	return fmt.Errorf("%s is still a mount point after 8 unmounts", dir)
}

// onItsShm reports whether the process pid sees the daemon's tmpfs as its /dev/shm (the same file system,
// through its own mount namespace). A daemon an agent before per-GPU tmpfs started shares the node's
// directory instead, and clients that mount the GPU's tmpfs could not reach it.
func (m *Manager) onItsShm(k key, pid int) (bool, error) {
	var daemon, tmpfs unix.Stat_t
	if err := unix.Stat(filepath.Join(m.cfg.ProcRoot, strconv.Itoa(pid), "root/dev/shm"), &daemon); err != nil {
		return false, fmt.Errorf("reading MPS daemon %d's /dev/shm: %w", pid, err)
	}
	if err := unix.Stat(m.shmDir(k), &tmpfs); err != nil {
		return false, err
	}
	return daemon.Dev == tmpfs.Dev, nil
}

// tmpfsAt reports whether dir is a mount point of a tmpfs and its size in bytes. Any other file system
// mounted there is an error: the agent never mounts over, or unmounts, what it did not mount.
func tmpfsAt(dir string) (mounted bool, size int64, err error) {
	var st, parent unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return false, 0, &os.PathError{Op: "stat", Path: dir, Err: err}
	}
	if err := unix.Stat(filepath.Dir(dir), &parent); err != nil {
		return false, 0, &os.PathError{Op: "stat", Path: filepath.Dir(dir), Err: err}
	}
	// A mount point's device differs from its parent directory's (each tmpfs has a device of its own).
	if st.Dev == parent.Dev {
		return false, 0, nil
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return false, 0, &os.PathError{Op: "statfs", Path: dir, Err: err}
	}
	if fs.Type != unix.TMPFS_MAGIC {
		return false, 0, fmt.Errorf("%s is a mount point of another file system (type %#x), not an MPS tmpfs", dir, fs.Type)
	}
	return true, int64(fs.Blocks) * fs.Bsize, nil
}

// roundToPage is the size tmpfs reports for a size option: whole pages.
func roundToPage(n int64) int64 {
	page := int64(os.Getpagesize())
	return (n + page - 1) / page * page
}
