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
	"create-namespace", "set", // helm
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
	refs, err := filepath.Glob(filepath.Join(root, refDir, "*-flags.md"))
	if err != nil {
		return nil, err
	}
	for _, path := range refs {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(string(b), "\n") {
			if m := refFlag.FindStringSubmatch(line); m != nil {
				known[m[1]] = true
			}
		}
	}
	var faults []string
	for _, doc := range docs {
		b, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			return nil, err
		}
		for i, line := range strings.Split(string(b), "\n") {
			for _, m := range docFlag.FindAllStringSubmatch(line, -1) {
				if !knownFlag(known, m[1]) {
					faults = append(faults, fmt.Sprintf("%s:%d: --%s is no flag of agent, manager or gpushare-scheduler (%s/*-flags.md) nor of another program hack/refdocs knows", doc, i+1, m[1], refDir))
				}
			}
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
