package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func writeEntries(t *testing.T, entries map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for id, body := range entries {
		if err := os.WriteFile(filepath.Join(dir, id+".json"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func TestWritesTheIndexGovulncheckReads(t *testing.T) {
	entries := map[string]string{
		// Fixed once: the index says so, and govulncheck skips the entry at or above it.
		"GO-2026-0001": `{"id":"GO-2026-0001","modified":"0001-01-01T00:00:00Z","aliases":["CVE-2026-1"],"affected":[{"package":{"name":"example.com/a"},"ranges":[{"type":"SEMVER","events":[{"introduced":"0"},{"fixed":"1.2.0"}]}]}]}`,
		// Fixed in 1.5.0 but introduced again in 2.0.0: no version is known to be fixed.
		"GO-2026-0002": `{"id":"GO-2026-0002","modified":"2026-03-01T10:00:00Z","affected":[{"package":{"name":"example.com/a"},"ranges":[{"type":"SEMVER","events":[{"introduced":"0"},{"fixed":"1.5.0"},{"introduced":"2.0.0"}]}]}]}`,
		// Two fixes in two ranges: the later one; a pseudo-version orders before its release.
		"GO-2026-0003": `{"id":"GO-2026-0003","modified":"0001-01-01T00:00:00Z","affected":[{"package":{"name":"example.com/b"},"ranges":[{"type":"SEMVER","events":[{"introduced":"0"},{"fixed":"0.0.0-20260101000000-abcdefabcdef"}]},{"type":"SEMVER","events":[{"introduced":"0.1.0"},{"fixed":"0.10.1"}]}]}]}`,
	}
	out := t.TempDir()
	if err := run(writeEntries(t, entries), out, "2026-08-21T12:00:00Z"); err != nil {
		t.Fatal(err)
	}

	var db map[string]string
	readJSON(t, filepath.Join(out, "index", "db.json"), &db)
	if db["modified"] != "2026-08-21T12:00:00Z" {
		t.Errorf("db.json modified %q, want the newest entry's time (the snapshot's for entries without one)", db["modified"])
	}
	var modules []module
	readJSON(t, filepath.Join(out, "index", "modules.json"), &modules)
	want := []module{
		{Path: "example.com/a", Vulns: []moduleVuln{
			{ID: "GO-2026-0001", Modified: "2026-08-21T12:00:00Z", Fixed: "1.2.0"},
			{ID: "GO-2026-0002", Modified: "2026-03-01T10:00:00Z"},
		}},
		{Path: "example.com/b", Vulns: []moduleVuln{{ID: "GO-2026-0003", Modified: "2026-08-21T12:00:00Z", Fixed: "0.10.1"}}},
	}
	if !reflect.DeepEqual(modules, want) {
		t.Errorf("modules.json\n got %+v\nwant %+v", modules, want)
	}
	var vulns []vuln
	readJSON(t, filepath.Join(out, "index", "vulns.json"), &vulns)
	if len(vulns) != 3 || vulns[0].ID != "GO-2026-0001" || !reflect.DeepEqual(vulns[0].Aliases, []string{"CVE-2026-1"}) {
		t.Errorf("vulns.json %+v", vulns)
	}
	for id, body := range entries {
		b, err := os.ReadFile(filepath.Join(out, "ID", id+".json"))
		if err != nil || string(b) != body {
			t.Errorf("ID/%s.json is not the OSV entry as published (err %v)", id, err)
		}
	}
}

func TestRefusesAnEntryWhoseIDDoesNotNameItsFile(t *testing.T) {
	dir := writeEntries(t, map[string]string{"GO-2026-0009": `{"id":"GO-2026-0001","affected":[]}`})
	err := run(dir, t.TempDir(), "")
	if err == nil || !strings.Contains(err.Error(), "does not name the file") {
		t.Errorf("err %v, want a refusal naming the mismatch", err)
	}
}

func TestRefusesAnEmptyFolder(t *testing.T) {
	if err := run(t.TempDir(), t.TempDir(), ""); err == nil || !strings.Contains(err.Error(), "no OSV entries") {
		t.Errorf("err %v, want no OSV entries", err)
	}
}
