// Command mkimage writes an OCI image archive (an OCI image layout, tarred) without a container engine:
// one layer per -layer directory (a root file system, for example one unpacked from Debian packages by
// hack/debian-rootfs.sh) and a last layer of single files (-file /dest=src). make images uses it for the
// manager, agent, pause and busybox images that make e2e imports into containerd.
//
// The archive is reproducible: entries are sorted, owned by root and dated at the epoch, so the same
// inputs give the same digests and an image only changes when a file in it does.
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var layers, files, env listFlag
	out := flag.String("o", "", "archive to write (an OCI image layout in a tar)")
	ref := flag.String("ref", "", "image name the archive carries, e.g. gpusharing.io/agent:e2e (containerd imports it under this name)")
	entrypoint := flag.String("entrypoint", "", "entrypoint, words separated by spaces")
	user := flag.String("user", "", "user the image runs as (uid:gid)")
	flag.Var(&layers, "layer", "a directory to add as one layer (repeatable, in order)")
	flag.Var(&files, "file", "/dest=src: a file for the last layer (repeatable); src's mode is kept")
	flag.Var(&env, "env", "KEY=value for the image config (repeatable)")
	flag.Parse()
	if *out == "" || *ref == "" {
		fmt.Fprintln(os.Stderr, "mkimage: -o and -ref are required")
		os.Exit(2)
	}
	if err := build(*out, *ref, *entrypoint, *user, layers, files, env); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func build(out, ref, entrypoint, user string, layerDirs, files, env []string) error {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for _, dir := range layerDirs {
		data, err := tarDir(dir)
		if err != nil {
			return fmt.Errorf("layer %s: %w", dir, err)
		}
		if img, err = appendLayer(img, data); err != nil {
			return err
		}
	}
	if len(files) > 0 {
		data, err := tarFiles(files)
		if err != nil {
			return err
		}
		if img, err = appendLayer(img, data); err != nil {
			return err
		}
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.OS = "amd64", "linux"
	cfg.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cfg.Config.Env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
	if entrypoint != "" {
		cfg.Config.Entrypoint = strings.Fields(entrypoint)
	}
	cfg.Config.User = user
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return err
	}
	return writeArchive(out, ref, img)
}

func appendLayer(img v1.Image, data []byte) (v1.Image, error) {
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	return mutate.Append(img, mutate.Addendum{Layer: layer, MediaType: types.OCILayer})
}

// writeArchive writes img as an OCI layout into a temporary directory and tars it to out. The index
// names the image twice: containerd's import reads io.containerd.image.name, other tools the OCI tag.
func writeArchive(out, ref string, img v1.Image) error {
	dir, err := os.MkdirTemp("", "mkimage")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	tag := ref[strings.LastIndex(ref, ":")+1:]
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"io.containerd.image.name":          ref,
		"org.opencontainers.image.ref.name": tag,
	})); err != nil {
		return err
	}
	data, err := tarDir(dir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	tmp := out + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

// tarDir tars a directory tree: sorted, root-owned, epoch-dated; symlinks stay links.
func tarDir(root string) ([]byte, error) {
	var paths []string
	err := filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != root {
			paths = append(paths, p)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(paths)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return nil, err
		}
		if err := addEntry(tw, filepath.ToSlash(rel), p); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// tarFiles tars /dest=src pairs, with every parent directory of a destination.
func tarFiles(specs []string) ([]byte, error) {
	dests := map[string]string{}
	dirs := map[string]bool{}
	for _, s := range specs {
		dest, src, ok := strings.Cut(s, "=")
		if !ok || !strings.HasPrefix(dest, "/") || src == "" {
			return nil, fmt.Errorf("-file %q: want /dest=src", s)
		}
		dest = strings.TrimPrefix(path.Clean(dest), "/")
		dests[dest] = src
		for d := path.Dir(dest); d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	var names []string
	for d := range dirs {
		names = append(names, d+"/")
	}
	for d := range dests {
		names = append(names, d)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		var err error
		if strings.HasSuffix(n, "/") {
			err = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: n, Mode: 0o755, ModTime: time.Unix(0, 0), Format: tar.FormatPAX})
		} else {
			err = addEntry(tw, n, dests[n])
		}
		if err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func addEntry(tw *tar.Writer, name, src string) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	link := ""
	if fi.Mode()&fs.ModeSymlink != 0 {
		if link, err = os.Readlink(src); err != nil {
			return err
		}
	}
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return err
	}
	hdr.Name = name
	if fi.IsDir() {
		hdr.Name += "/"
	}
	hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
	hdr.ModTime, hdr.AccessTime, hdr.ChangeTime = time.Unix(0, 0), time.Time{}, time.Time{}
	hdr.Format = tar.FormatPAX
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return nil
	}
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	_, err = io.Copy(tw, f)
	return err
}
