//go:build e2e

package e2e

import (
	"archive/tar"
	"bufio"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/gpusharing/gpusharing/test/testenv"
)

// dockerStage is what a final stage of the Dockerfile puts in its image: the files it copies (by
// destination), its entrypoint and user.
type dockerStage struct {
	files      []string
	entrypoint string
	user       string
}

var (
	fromRE  = regexp.MustCompile(`^FROM\s+\S+\s+AS\s+(\S+)`)
	copyRE  = regexp.MustCompile(`^COPY\s+--from=\S+\s+\S+\s+(\S+)`)
	entryRE = regexp.MustCompile(`^ENTRYPOINT\s+\["([^"]+)"`)
	userRE  = regexp.MustCompile(`^USER\s+(\S+)`)
)

func dockerfileStages(t *testing.T) map[string]*dockerStage {
	t.Helper()
	f, err := os.Open(filepath.Join(testenv.RepoRoot(), "Dockerfile"))
	must(t, err)
	defer func() { _ = f.Close() }()
	stages := map[string]*dockerStage{}
	var cur *dockerStage
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if m := fromRE.FindStringSubmatch(line); m != nil {
			cur = &dockerStage{}
			stages[m[1]] = cur
			continue
		}
		if cur == nil {
			continue
		}
		if m := copyRE.FindStringSubmatch(line); m != nil {
			cur.files = append(cur.files, m[1])
		} else if m := entryRE.FindStringSubmatch(line); m != nil {
			cur.entrypoint = m[1]
		} else if m := userRE.FindStringSubmatch(line); m != nil {
			cur.user = m[1]
		}
	}
	return stages
}

// TestImagesMatchTheDockerfile: make images (no Docker) and the Dockerfile (for users with Docker) put
// the same files at the same paths, with the same entrypoint and user, in the manager and agent images.
// The bases differ by design (Debian packages here, distroless and debian-slim there); the files the
// product ships do not.
func TestImagesMatchTheDockerfile(t *testing.T) {
	stages := dockerfileStages(t)
	for _, name := range []string{"manager", "agent"} {
		t.Run(name, func(t *testing.T) {
			want := stages[name]
			if want == nil || len(want.files) == 0 {
				t.Fatalf("the Dockerfile has no final stage %q copying files", name)
			}
			dir := t.TempDir()
			untar(t, filepath.Join(node.Bin, "images", name+".tar"), dir)
			p, err := layout.FromPath(dir)
			must(t, err)
			idx, err := p.ImageIndex()
			must(t, err)
			im, err := idx.IndexManifest()
			must(t, err)
			img, err := idx.Image(im.Manifests[0].Digest)
			must(t, err)
			layers, err := img.Layers()
			must(t, err)
			rc, err := layers[len(layers)-1].Uncompressed()
			must(t, err)
			defer func() { _ = rc.Close() }()
			var got []string
			tr := tar.NewReader(rc)
			for {
				h, err := tr.Next()
				if err == io.EOF {
					break
				}
				must(t, err)
				if h.Typeflag == tar.TypeReg {
					got = append(got, "/"+h.Name)
				}
			}
			slices.Sort(got)
			wantFiles := slices.Clone(want.files)
			slices.Sort(wantFiles)
			if !slices.Equal(got, wantFiles) {
				t.Errorf("make images ships %v, the Dockerfile %v", got, wantFiles)
			}
			cfg, err := img.ConfigFile()
			must(t, err)
			if len(cfg.Config.Entrypoint) == 0 || cfg.Config.Entrypoint[0] != want.entrypoint {
				t.Errorf("entrypoint %v, the Dockerfile's %s", cfg.Config.Entrypoint, want.entrypoint)
			}
			if cfg.Config.User != want.user {
				t.Errorf("user %q, the Dockerfile's %q", cfg.Config.User, want.user)
			}
		})
	}
}

func untar(t *testing.T, archive, dir string) {
	t.Helper()
	f, err := os.Open(archive)
	must(t, err)
	defer func() { _ = f.Close() }()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		must(t, err)
		path := filepath.Join(dir, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			must(t, os.MkdirAll(path, 0o755))
		case tar.TypeReg:
			must(t, os.MkdirAll(filepath.Dir(path), 0o755))
			data, err := io.ReadAll(tr)
			must(t, err)
			must(t, os.WriteFile(path, data, 0o644))
		}
	}
}
