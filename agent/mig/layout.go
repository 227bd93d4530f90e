package mig

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseLayout reads a layout as people write it, "3g.40gb x1 + 1g.10gb x4" ("x1" may be left out),
// for the agent's plan command.
func ParseLayout(s string) ([]Want, error) {
	var out []Want
	for _, part := range strings.Split(s, "+ ") {
		f := strings.Fields(part)
		if len(f) == 0 || len(f) > 2 {
			return nil, fmt.Errorf("layout %q: %q is not \"<profile> x<count>\"", s, strings.TrimSpace(part))
		}
		w := Want{Profile: f[0], Count: 1}
		if len(f) == 2 {
			n, err := strconv.Atoi(strings.TrimPrefix(f[1], "x"))
			if err != nil || !strings.HasPrefix(f[1], "x") || n < 1 {
				return nil, fmt.Errorf("layout %q: count %q is not x<positive number>", s, f[1])
			}
			w.Count = n
		}
		out = append(out, w)
	}
	return out, nil
}
