package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// stream is govulncheck -format json output: one vulnerability called in the standard library, one
// called in a module, one only imported.
const stream = `{"config":{"protocol_version":"v1.0.0","db":"file:///db","db_last_modified":"2026-11-05T23:49:57Z","go_version":"go1.26.8","scan_level":"symbol"}}
{"osv":{"id":"GO-2026-0001","summary":"net/http crash"}}
{"osv":{"id":"GO-2026-0002","summary":"grpc crash"}}
{"finding":{"osv":"GO-2026-0001","fixed_version":"v1.26.9","trace":[{"module":"stdlib","version":"v1.26.8","package":"net/http","function":"Serve","receiver":"*Server"},{"module":"example.com/app","package":"example.com/app","function":"main"}]}}
{"finding":{"osv":"GO-2026-0002","fixed_version":"v1.83.2","trace":[{"module":"google.golang.org/grpc","version":"v1.83.1","package":"google.golang.org/grpc","function":"NewServer"}]}}
{"finding":{"osv":"GO-2026-0003","fixed_version":"v0.62.0","trace":[{"module":"golang.org/x/net","version":"v0.60.0"}]}}
`

var now = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

func judged(t *testing.T, acc map[string]acceptance) (bool, string) {
	t.Helper()
	ok, out, err := judge(strings.NewReader(stream), acc, now)
	if err != nil {
		t.Fatal(err)
	}
	return ok, out
}

func TestFailsOnACalledVulnerabilityNobodyAccepted(t *testing.T) {
	ok, out := judged(t, map[string]acceptance{"GO-2026-0001": {until: now.AddDate(0, 1, 0), reason: "toolchain", line: 1}})
	if ok {
		t.Fatalf("passed with GO-2026-0002 called and not accepted:\n%s", out)
	}
	for _, want := range []string{
		"govulncheck with go1.26.8 against file:///db (modified 2026-11-05T23:49:57Z)",
		"GO-2026-0002 google.golang.org/grpc@v1.83.1 (fixed in v1.83.2) called: google.golang.org/grpc.NewServer",
		"NOT ACCEPTED",
		"GO-2026-0001 stdlib@v1.26.8 (fixed in v1.26.9) called: net/http.*Server.Serve",
		"accepted until 2027-01-07: toolchain",
		"2 vulnerabilities called, 1 more in imported but uncalled code",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

func TestPassesWhenEveryCalledVulnerabilityIsAccepted(t *testing.T) {
	later := now.AddDate(0, 1, 0)
	ok, out := judged(t, map[string]acceptance{"GO-2026-0001": {until: later, reason: "a"}, "GO-2026-0002": {until: later, reason: "b"}})
	if !ok {
		t.Errorf("failed with every called vulnerability accepted:\n%s", out)
	}
}

func TestFailsOnAnExpiredAcceptance(t *testing.T) {
	later := now.AddDate(0, 1, 0)
	ok, out := judged(t, map[string]acceptance{"GO-2026-0001": {until: now.AddDate(0, 0, -2), reason: "a"}, "GO-2026-0002": {until: later, reason: "b"}})
	if ok || !strings.Contains(out, "acceptance EXPIRED on 2026-12-05") {
		t.Errorf("an expired acceptance passed (ok %v):\n%s", ok, out)
	}
}

func TestFailsOnAnAcceptanceOfSomethingNoLongerCalled(t *testing.T) {
	later := now.AddDate(0, 1, 0)
	ok, out := judged(t, map[string]acceptance{"GO-2026-0001": {until: later, reason: "a"}, "GO-2026-0002": {until: later, reason: "b"},
		"GO-2026-0003": {until: later, reason: "only imported", line: 7}})
	if ok || !strings.Contains(out, "GO-2026-0003 is accepted (line 7) but no longer called: remove it") {
		t.Errorf("a stale acceptance passed (ok %v):\n%s", ok, out)
	}
}

func TestReadsTheAcceptedFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "accepted.txt")
	if err := os.WriteFile(p, []byte("# comment\n\nGO-2026-0001 2027-01-31 standard library: fixed in go1.26.9\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	acc, err := readAccepted(p)
	if err != nil {
		t.Fatal(err)
	}
	a := acc["GO-2026-0001"]
	if len(acc) != 1 || a.until.Format(time.DateOnly) != "2027-01-31" || a.reason != "standard library: fixed in go1.26.9" || a.line != 3 {
		t.Errorf("read %+v", acc)
	}
	if err := os.WriteFile(p, []byte("GO-2026-0001 2027-01-31\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readAccepted(p); err == nil || !strings.Contains(err.Error(), "want ID UNTIL REASON") {
		t.Errorf("a line without a reason: err %v", err)
	}
}
