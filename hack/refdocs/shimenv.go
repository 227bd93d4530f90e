package main

import (
	"fmt"
	"path/filepath"
	"regexp"
	"sort"
)

// The shim is configured through its environment, so its variables are its flags: each one it reads
// must have a row in its doc's configuration table, and each row must name a variable it reads. The
// meanings stay hand-written there (the C source has nowhere to keep them); this keeps the table whole.
var (
	shimRead = regexp.MustCompile(`\b(?:getenv|env_[a-z0-9_]+|dev_value)\(\s*"(GPUSHARE_[A-Z0-9_]+)"`)
	shimRow  = regexp.MustCompile("^\\| `(GPUSHARE_[A-Z0-9_]+)` \\|")
)

// checkShimEnv compares the variables the C files of srcDir read with the rows of doc's tables.
func checkShimEnv(srcDir, doc string) ([]string, error) {
	read := map[string]string{}
	err := eachLine(filepath.Join(srcDir, "*.c"), func(path string, n int, line string) {
		for _, m := range shimRead.FindAllStringSubmatch(line, -1) {
			if _, ok := read[m[1]]; !ok {
				read[m[1]] = fmt.Sprintf("%s:%d", path, n)
			}
		}
	})
	if err != nil {
		return nil, err
	}
	rows := map[string]int{}
	err = eachLine(doc, func(_ string, n int, line string) {
		if m := shimRow.FindStringSubmatch(line); m != nil {
			rows[m[1]] = n
		}
	})
	if err != nil {
		return nil, err
	}
	var faults []string
	for name, at := range read {
		if _, ok := rows[name]; !ok {
			faults = append(faults, fmt.Sprintf("%s: the shim reads %s, which has no row in %s", at, name, doc))
		}
	}
	for name, line := range rows {
		if _, ok := read[name]; !ok {
			faults = append(faults, fmt.Sprintf("%s:%d: %s has a row but the shim does not read it", doc, line, name))
		}
	}
	sort.Strings(faults)
	return faults, nil
}
