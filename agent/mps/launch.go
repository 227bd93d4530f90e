package mps

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// LaunchCommand is the agent's subcommand that starts a daemon with its GPU's tmpfs as /dev/shm:
//
//	agent mps-launch <shm-dir> <program> [args...]
//
// The manager runs it (through the Runner) as Launcher mps-launch <shm-dir> nvidia-cuda-mps-control -d.
const LaunchCommand = "mps-launch"

// ErrLaunchUsage is returned for a malformed mps-launch command line.
var ErrLaunchUsage = errors.New("usage: mps-launch <shm-dir> <program> [args...], both absolute paths")

// Launch is the body of mps-launch: in a mount namespace of its own it binds shmDir (which must be a
// tmpfs) onto /dev/shm and then replaces itself with program; it returns only on failure. The control
// daemon forks into the background and starts its servers, and all of them inherit the namespace, so
// every process of the GPU's MPS sees only that GPU's tmpfs at /dev/shm, while the agent's own namespace
// is left as it was.
func Launch(args, env []string) error {
	if len(args) < 2 || !filepath.IsAbs(args[0]) || !filepath.IsAbs(args[1]) {
		return ErrLaunchUsage
	}
	shmDir, argv := args[0], args[1:]
	// A mount namespace belongs to a thread: unshare, mount and exec must all happen on this one.
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unsharing the mount namespace: %w", err)
	}
	// Slave, not private: the daemon's namespace still receives unmounts from the agent's. A private copy
	// would keep every other GPU's tmpfs mounted in it, so an unmounted GPU's memory would live on for as
	// long as this daemon runs. Nothing mounted here reaches the agent's namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("making the daemon's mounts slaves of the agent's: %w", err)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(shmDir, &fs); err != nil {
		return fmt.Errorf("the daemon's shared memory directory: %w", err)
	}
	if fs.Type != unix.TMPFS_MAGIC {
		return fmt.Errorf("%s is not a tmpfs (file system type %#x): refusing it as the daemon's /dev/shm", shmDir, fs.Type)
	}
	if err := unix.Mount(shmDir, "/dev/shm", "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("binding %s onto /dev/shm: %w", shmDir, err)
	}
	if err := unix.Exec(argv[0], argv, env); err != nil {
		return fmt.Errorf("executing %s: %w", argv[0], err)
	}
	return nil
}
