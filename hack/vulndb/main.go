// Command vulndb writes a Go vulnerability database in the layout govulncheck reads with
// -db file://DIR (index/db.json, index/modules.json, index/vulns.json, ID/<id>.json) from a folder of
// OSV entries: data/osv of golang.org/x/vulndb, which the Go module proxy serves as a module. So `make
// vulncheck` needs nothing but the module proxy, and the database is pinned by that module's version.
//
//	go run ./hack/vulndb -osv $(go mod download -json golang.org/x/vulndb@V | jq -r .Dir)/data/osv -out DIR -modified T
//
// The entries in data/osv carry no modification time (the published database stamps it from git
// history); -modified, the snapshot's commit time, stands in for every entry that has none.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/mod/semver"
)

// entry is the part of an OSV entry the index needs.
type entry struct {
	ID       string    `json:"id"`
	Modified time.Time `json:"modified"`
	Aliases  []string  `json:"aliases,omitempty"`
	Affected []struct {
		Package struct {
			Name string `json:"name"`
		} `json:"package"`
		Ranges []osvRange `json:"ranges"`
	} `json:"affected"`
}

type osvRange struct {
	Type   string `json:"type"`
	Events []struct {
		Introduced string `json:"introduced,omitempty"`
		Fixed      string `json:"fixed,omitempty"`
	} `json:"events"`
}

type moduleVuln struct {
	ID       string `json:"id"`
	Modified string `json:"modified"`
	Fixed    string `json:"fixed,omitempty"`
}

type module struct {
	Path  string       `json:"path"`
	Vulns []moduleVuln `json:"vulns"`
}

type vuln struct {
	ID       string   `json:"id"`
	Modified string   `json:"modified"`
	Aliases  []string `json:"aliases,omitempty"`
}

func main() {
	osvDir := flag.String("osv", "", "folder of OSV JSON entries (golang.org/x/vulndb's data/osv)")
	out := flag.String("out", "", "folder to write the database to")
	modified := flag.String("modified", "", "RFC 3339 time for entries that carry none (the snapshot's commit time)")
	flag.Parse()
	if err := run(*osvDir, *out, *modified); err != nil {
		fmt.Fprintln(os.Stderr, "vulndb:", err)
		os.Exit(1)
	}
}

func run(osvDir, out, modified string) error {
	if osvDir == "" || out == "" {
		return errors.New("-osv and -out are required")
	}
	fallback := time.Time{}
	if modified != "" {
		t, err := time.Parse(time.RFC3339, modified)
		if err != nil {
			return fmt.Errorf("-modified: %w", err)
		}
		fallback = t.UTC()
	}
	files, err := filepath.Glob(filepath.Join(osvDir, "*.json"))
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("no OSV entries in %s", osvDir)
	}
	if err := os.MkdirAll(filepath.Join(out, "ID"), 0o755); err != nil {
		return err
	}
	modules := map[string]*module{}
	var vulns []vuln
	var newest time.Time
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var e entry
		if err := json.Unmarshal(raw, &e); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if e.ID == "" || e.ID+".json" != filepath.Base(f) {
			return fmt.Errorf("%s: id %q does not name the file", f, e.ID)
		}
		mod := e.Modified.UTC()
		if mod.IsZero() || mod.Year() < 2 {
			mod = fallback
		}
		if mod.After(newest) {
			newest = mod
		}
		stamp := mod.Format(time.RFC3339)
		vulns = append(vulns, vuln{ID: e.ID, Modified: stamp, Aliases: e.Aliases})
		for _, a := range e.Affected {
			m := modules[a.Package.Name]
			if m == nil {
				m = &module{Path: a.Package.Name, Vulns: []moduleVuln{}}
				modules[a.Package.Name] = m
			}
			m.Vulns = append(m.Vulns, moduleVuln{ID: e.ID, Modified: stamp, Fixed: latestFixed(a.Ranges)})
		}
		if err := os.WriteFile(filepath.Join(out, "ID", e.ID+".json"), raw, 0o644); err != nil {
			return err
		}
	}
	sort.Slice(vulns, func(i, j int) bool { return vulns[i].ID < vulns[j].ID })
	var mods []*module
	for _, m := range modules {
		sort.SliceStable(m.Vulns, func(i, j int) bool { return m.Vulns[i].ID < m.Vulns[j].ID })
		mods = append(mods, m)
	}
	sort.Slice(mods, func(i, j int) bool { return mods[i].Path < mods[j].Path })
	index := filepath.Join(out, "index")
	if err := os.MkdirAll(index, 0o755); err != nil {
		return err
	}
	for name, v := range map[string]any{
		"db.json":      map[string]string{"modified": newest.Format(time.RFC3339)},
		"modules.json": mods,
		"vulns.json":   vulns,
	} {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(index, name), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// latestFixed is the highest fixed version of the SEMVER ranges, or "" when a range introduces the
// vulnerability again after it (no version is known to be fixed), as the published index says.
func latestFixed(ranges []osvRange) string {
	latest := ""
	for _, r := range ranges {
		if r.Type != "SEMVER" {
			continue
		}
		for _, e := range r.Events {
			if e.Fixed != "" && before(latest, e.Fixed) {
				latest = e.Fixed
			}
		}
		for _, e := range r.Events {
			if e.Introduced != "" && e.Introduced != "0" && before(latest, e.Introduced) {
				latest = ""
				break
			}
		}
	}
	return latest
}

// before says whether OSV version a (no "v") precedes b; "" precedes every version.
func before(a, b string) bool {
	if a == "" {
		return b != ""
	}
	return semver.Compare("v"+strings.TrimPrefix(a, "v"), "v"+strings.TrimPrefix(b, "v")) < 0
}
