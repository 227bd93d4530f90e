// Command vulnreport judges govulncheck's JSON output (-format json) for make vulncheck: it prints each
// vulnerability the code calls (a finding whose trace reaches a function) with its module, version and
// fix, and fails unless every one is accepted in the -accepted file. An acceptance is a line
//
//	GO-YYYY-NNNN YYYY-MM-DD reason...
//
// and holds until that date. An acceptance that has expired, or names a vulnerability the code no longer
// calls, fails too, so the file cannot outlive its reasons. Vulnerabilities of imported but uncalled
// code are counted, not judged (govulncheck's own default).
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

type message struct {
	Config *struct {
		DB             string `json:"db"`
		DBLastModified string `json:"db_last_modified"`
		GoVersion      string `json:"go_version"`
	} `json:"config"`
	OSV *struct {
		ID      string `json:"id"`
		Summary string `json:"summary"`
	} `json:"osv"`
	Finding *struct {
		OSV          string `json:"osv"`
		FixedVersion string `json:"fixed_version"`
		Trace        []struct {
			Module   string `json:"module"`
			Version  string `json:"version"`
			Package  string `json:"package"`
			Function string `json:"function"`
			Receiver string `json:"receiver"`
		} `json:"trace"`
	} `json:"finding"`
}

// called is one vulnerability the code reaches.
type called struct {
	id, module, version, fixed, example string
}

type acceptance struct {
	until  time.Time
	reason string
	line   int
}

func main() {
	accepted := flag.String("accepted", "", "file of accepted vulnerabilities: ID UNTIL(YYYY-MM-DD) REASON per line, # comments")
	flag.Parse()
	acc := map[string]acceptance{}
	if *accepted != "" {
		var err error
		if acc, err = readAccepted(*accepted); err != nil {
			fmt.Fprintln(os.Stderr, "vulnreport:", err)
			os.Exit(2)
		}
	}
	ok, report, err := judge(os.Stdin, acc, time.Now())
	if err != nil {
		fmt.Fprintln(os.Stderr, "vulnreport:", err)
		os.Exit(2)
	}
	fmt.Print(report)
	if !ok {
		os.Exit(1)
	}
}

func readAccepted(path string) (map[string]acceptance, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	out := map[string]acceptance{}
	s := bufio.NewScanner(f)
	for n := 1; s.Scan(); n++ {
		line := strings.TrimSpace(s.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.SplitN(line, " ", 3)
		if len(fields) < 3 || !strings.HasPrefix(fields[0], "GO-") || strings.TrimSpace(fields[2]) == "" {
			return nil, fmt.Errorf("%s:%d: want ID UNTIL REASON, got %q", path, n, line)
		}
		until, err := time.Parse(time.DateOnly, fields[1])
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		if _, dup := out[fields[0]]; dup {
			return nil, fmt.Errorf("%s:%d: %s accepted twice", path, n, fields[0])
		}
		out[fields[0]] = acceptance{until: until, reason: strings.TrimSpace(fields[2]), line: n}
	}
	return out, s.Err()
}

// judge reads govulncheck's message stream from r and returns whether it passes, and the report.
func judge(r io.Reader, acc map[string]acceptance, now time.Time) (bool, string, error) {
	dec := json.NewDecoder(r)
	summaries := map[string]string{}
	found := map[string]*called{}
	imported := map[string]bool{}
	var db, goVersion string
	for {
		var m message
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return false, "", fmt.Errorf("reading govulncheck's JSON: %w", err)
		}
		switch {
		case m.Config != nil:
			db, goVersion = m.Config.DB+" (modified "+m.Config.DBLastModified+")", m.Config.GoVersion
		case m.OSV != nil:
			summaries[m.OSV.ID] = m.OSV.Summary
		case m.Finding != nil && len(m.Finding.Trace) > 0:
			f := m.Finding
			top := f.Trace[0]
			if top.Function == "" {
				imported[f.OSV] = true
				continue
			}
			if found[f.OSV] == nil {
				fn := top.Function
				if top.Receiver != "" {
					fn = top.Receiver + "." + fn
				}
				found[f.OSV] = &called{id: f.OSV, module: top.Module, version: top.Version, fixed: f.FixedVersion, example: top.Package + "." + fn}
			}
		}
	}
	if db == "" {
		return false, "", errors.New("no govulncheck config message: was it run with -format json?")
	}
	var w strings.Builder
	fmt.Fprintf(&w, "govulncheck with %s against %s\n", goVersion, db)
	ids := make([]string, 0, len(found))
	for id := range found {
		ids = append(ids, id)
		delete(imported, id)
	}
	sort.Strings(ids)
	pass := true
	for _, id := range ids {
		c := found[id]
		verdict := "NOT ACCEPTED"
		if a, ok := acc[id]; ok && !now.After(a.until.AddDate(0, 0, 1)) {
			verdict = "accepted until " + a.until.Format(time.DateOnly) + ": " + a.reason
		} else if ok {
			verdict = "acceptance EXPIRED on " + a.until.Format(time.DateOnly)
			pass = false
		} else {
			pass = false
		}
		fmt.Fprintf(&w, "%s %s@%s (fixed in %s) called: %s\n    %s\n    %s\n", id, c.module, c.version, c.fixed, c.example, summaries[id], verdict)
	}
	var stale []string
	for id := range acc {
		if found[id] == nil {
			stale = append(stale, id)
		}
	}
	sort.Strings(stale)
	for _, id := range stale {
		fmt.Fprintf(&w, "%s is accepted (line %d) but no longer called: remove it\n", id, acc[id].line)
		pass = false
	}
	fmt.Fprintf(&w, "%d vulnerabilities called, %d more in imported but uncalled code\n", len(ids), len(imported))
	return pass, w.String(), nil
}
