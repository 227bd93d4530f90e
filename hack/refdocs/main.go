// Command refdocs writes the reference that must not drift from the code, docs/reference/api.md (every
// field of the API types with its type, default and admission checks) and docs/reference/conditions.md
// (every condition type and reason with when it surfaces and what to do), from the Go source and its
// comments and markers. It fails, writing nothing, when a type, field, condition type or reason has no
// comment, a reason's comment has no "What to do:" part, a variable the shim reads has no row in
// docs/shim.md, or a guide names a --flag that no binary has. With -check it writes nothing and also fails when the committed reference differs from
// what it would write. The flags of each binary are in docs/reference/*-flags.md, written by their own
// tests (internal/flagref).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// config says where the sources and the reference are, relative to root.
type config struct {
	root, api, group, out, shimSrc, shimDoc, docs string
	kinds, reasonRoots                            []string
}

func main() {
	var c config
	var kinds, roots string
	check := flag.Bool("check", false, "write nothing; fail when the committed reference differs from what would be written")
	flag.StringVar(&c.root, "root", ".", "the repository root")
	flag.StringVar(&c.api, "api", "api/v1alpha1", "the API package")
	flag.StringVar(&c.group, "group", "gpusharing.io/v1alpha1", "the API group and version")
	flag.StringVar(&kinds, "kinds", "GPUSharingPolicy,GPUNode,GPUShareRecommendation", "the kinds, in the order the reference lists them")
	flag.StringVar(&roots, "reason-roots", "api,agent,controllers", "directories whose exported Reason constants are reasons")
	flag.StringVar(&c.out, "out", "docs/reference", "where the reference is written")
	flag.StringVar(&c.shimSrc, "shim-src", "shim/src", "the shim's C sources, whose getenv calls are its configuration")
	flag.StringVar(&c.shimDoc, "shim-doc", "docs/shim.md", "the doc whose table lists the shim's environment variables")
	flag.StringVar(&c.docs, "docs", "docs/*.md", "the guides, whose --flag code spans must name flags that exist")
	flag.Parse()
	c.kinds, c.reasonRoots = strings.Split(kinds, ","), strings.Split(roots, ",")
	if err := run(c, *check); err != nil {
		fmt.Fprintln(os.Stderr, "refdocs:", err)
		os.Exit(1)
	}
}

func run(c config, check bool) error {
	files, faults, err := generate(c)
	if err != nil {
		return err
	}
	if check {
		faults = append(faults, stale(c, files)...)
	}
	if len(faults) > 0 {
		return fmt.Errorf("the reference is incomplete:\n  %s", strings.Join(faults, "\n  "))
	}
	if check {
		return nil
	}
	if err := os.MkdirAll(filepath.Join(c.root, c.out), 0o755); err != nil {
		return err
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(c.root, c.out, name), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// generate renders the reference files (name to contents) and returns every fault found on the way.
func generate(c config) (map[string][]byte, []string, error) {
	p, err := loadAPI(filepath.Join(c.root, c.api))
	if err != nil {
		return nil, nil, err
	}
	api, faults := renderAPI(p, c.group, c.kinds)
	types, err := loadConsts(c.root, []string{c.api}, "Condition")
	if err != nil {
		return nil, nil, err
	}
	reasons, err := loadConsts(c.root, c.reasonRoots, "Reason")
	if err != nil {
		return nil, nil, err
	}
	conds, more := renderConditions(types, reasons)
	faults = append(faults, more...)
	if c.shimSrc != "" {
		shim, err := checkShimEnv(filepath.Join(c.root, c.shimSrc), filepath.Join(c.root, c.shimDoc))
		if err != nil {
			return nil, nil, err
		}
		faults = append(faults, shim...)
	}
	if c.docs != "" {
		docs, err := filepath.Glob(filepath.Join(c.root, c.docs))
		if err != nil {
			return nil, nil, err
		}
		for i := range docs {
			docs[i], _ = filepath.Rel(c.root, docs[i])
		}
		flags, err := checkDocFlags(c.root, c.out, docs)
		if err != nil {
			return nil, nil, err
		}
		faults = append(faults, flags...)
	}
	return map[string][]byte{"api.md": api, "conditions.md": conds}, faults, nil
}

// stale lists the reference files whose committed contents differ from files.
func stale(c config, files map[string][]byte) []string {
	var out []string
	for name, want := range files {
		path := filepath.Join(c.out, name)
		got, err := os.ReadFile(filepath.Join(c.root, path))
		if err != nil || !bytes.Equal(got, want) {
			out = append(out, fmt.Sprintf("%s is not what `make generate` writes from the source: run it", path))
		}
	}
	return out
}
