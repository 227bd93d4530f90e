package mps

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// probeCommand runs tenantProbe in a process of its own.
const probeCommand = "mps-tenant-probe"

// tenantProbe plays a tenant's container that does its worst with what its MPS share gives it. In a
// mount namespace of its own it builds a root file system that holds only the mounts given (host:container,
// as a share's container edits list them), chroots into it as a container runtime pivots into the
// container's root, and then prints one line per attempt:
//
//	file <path> <type>            every entry it can see
//	connect <path> <reply|error>  a connection to every socket it can see, and the first line answered
//	fill <bytes> <error>          writing /dev/shm full
//	unlink <path> <error>         removing every file it can see under the MPS pipe directory and /dev/shm
//
// It runs as root, as a root container does.
func tenantProbe(rootfs string, mounts []string) error {
	// The namespace and the root belong to this thread: every call below must run on it.
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unsharing the mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return err
	}
	if err := unix.Mount("tenant-root", rootfs, "tmpfs", 0, "size=1m"); err != nil {
		return err
	}
	for _, m := range mounts {
		host, ctr, ok := strings.Cut(m, ":")
		if !ok {
			return fmt.Errorf("mount %q is not host:container", m)
		}
		target := filepath.Join(rootfs, ctr)
		if err := os.MkdirAll(target, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(host, target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding %s onto %s: %w", host, target, err)
		}
	}
	if err := unix.Chroot(rootfs); err != nil {
		return err
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}

	var sockets, files []string
	_ = filepath.WalkDir("/", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			fmt.Printf("file %s error:%v\n", path, err)
			return nil
		}
		fmt.Printf("file %s %s\n", path, d.Type())
		switch {
		case d.Type()&fs.ModeSocket != 0:
			sockets = append(sockets, path)
		case !d.IsDir() && path != "/":
			files = append(files, path)
		}
		return nil
	})
	for _, s := range sockets {
		fmt.Printf("connect %s %s\n", s, dialOnce(s))
	}
	fmt.Printf("fill %s\n", fillShm("/dev/shm/tenant-fill"))
	for _, f := range files {
		fmt.Printf("unlink %s %v\n", f, os.Remove(f))
	}
	return nil
}

// dialOnce connects to a Unix socket and returns the first line the listener writes, or the error.
func dialOnce(path string) string {
	c, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		return "error:" + err.Error()
	}
	defer func() { _ = c.Close() }()
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if err != nil && !errors.Is(err, io.EOF) {
		return "error:" + err.Error()
	}
	return strings.TrimSpace(string(buf[:n]))
}

// fillShm writes 1 MiB blocks to path until a write fails, and returns the bytes written and why it
// stopped.
func fillShm(path string) string {
	f, err := os.Create(path)
	if err != nil {
		return "0 " + err.Error()
	}
	defer func() { _ = f.Close() }()
	block := make([]byte, 1<<20)
	var total int64
	for total < 1<<34 {
		n, err := f.Write(block)
		total += int64(n)
		if err != nil {
			return fmt.Sprintf("%d %v", total, err)
		}
	}
	return fmt.Sprintf("%d none", total)
}
