package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// externalFlags are the flags of other programs the docs name (the API server's, kubectl's, helm's,
// etcd's). A doc that names a flag of ours that no longer exists fails; one that names another
// program's flag is listed here.
var externalFlags = []string{
	"admission-control-config-file", "authorization-mode", "feature-gates", // kube-apiserver
	"create-namespace", "set", "kube-version", // helm
	"server-side",            // kubectl
	"unsafe-no-fsync",        // etcd
	"once", "timeout", "dra", // cmd/demo (docs/demo.md lists its flags)
}

var (
	docFlag = regexp.MustCompile("`--([a-z0-9][a-z0-9-]*)")
	refFlag = regexp.MustCompile("^\\| `--([a-z0-9][a-z0-9-]*)` \\|")
)

// checkDocFlags fails on a `--flag` code span in the docs that names no flag of the binaries' flag
// references (refDir/*-flags.md) and no external flag. A span ending in "-" (`--resource-*`) names the
// flags it starts.
func checkDocFlags(root, refDir string, docs []string) ([]string, error) {
	known := map[string]bool{}
	for _, f := range externalFlags {
		known[f] = true
	}
	err := eachLine(filepath.Join(root, refDir, "*-flags.md"), func(_ string, _ int, line string) {
		if m := refFlag.FindStringSubmatch(line); m != nil {
			known[m[1]] = true
		}
	})
	if err != nil {
		return nil, err
	}
	var faults []string
	for _, doc := range docs {
		err := eachLine(filepath.Join(root, doc), func(_ string, n int, line string) {
			for _, m := range docFlag.FindAllStringSubmatch(line, -1) {
				if !knownFlag(known, m[1]) {
					faults = append(faults, fmt.Sprintf("%s:%d: --%s is no flag of agent, manager or gpushare-scheduler (%s/*-flags.md) nor of another program hack/refdocs knows", doc, n, m[1], refDir))
				}
			}
		})
		if err != nil {
			return nil, err
		}
	}
	sort.Strings(faults)
	return faults, nil
}

func knownFlag(known map[string]bool, name string) bool {
	if known[name] {
		return true
	}
	if strings.HasSuffix(name, "-") {
		for k := range known {
			if strings.HasPrefix(k, name) {
				return true
			}
		}
	}
	return false
}

// eachLine calls f with every line of every file pattern matches (a plain path matches itself), its path
// and its 1-based number.
func eachLine(pattern string, f func(path string, n int, line string)) error {
	paths, err := filepath.Glob(pattern)
	if err != nil {
		return err
	}
	if len(paths) == 0 && !strings.ContainsAny(pattern, "*?[") {
		paths = []string{pattern} // so that a missing file is an error, as reading it was
	}
	for _, path := range paths {
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			f(path, i+1, line)
		}
	}
	return nil
}
