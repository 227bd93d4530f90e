package gitops

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/gpusharing/gpusharing/test/prom"
	"github.com/gpusharing/gpusharing/test/testenv"
)

func TestEveryAlertNamesAMetricTheCodeExports(t *testing.T) {
	have := exported(t)
	for _, path := range []string{
		filepath.Join(testenv.RepoRoot(), "config", "prometheus", "alerts.yaml"),
		filepath.Join(testenv.RepoRoot(), "charts", "gpusharing", "files", "prometheus", "alerts.yaml"),
	} {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var f prom.RulesFile
		if err := yaml.Unmarshal(data, &f); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		n := 0
		for _, g := range f.Groups {
			for _, r := range g.Rules {
				n++
				names := metricName.FindAllString(r.Expr, -1)
				if len(names) == 0 {
					t.Errorf("%s: alert %s names no gpusharing_ metric", path, r.Alert)
				}
				for _, m := range names {
					base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_sum"), "_count")
					if !have[m] && !have[base] {
						t.Errorf("%s: alert %s: %s is not a metric the code exports", path, r.Alert, m)
					}
				}
			}
		}
		if n == 0 {
			t.Errorf("%s has no rules", path)
		}
	}
}

// TestAlertRulesPassPromtool checks the rules file and its unit tests with Prometheus's own tool, where
// it is installed (Debian's prometheus package; the e2e installs it).
func TestAlertRulesPassPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed (apt-get install prometheus)")
	}
	dir := filepath.Join(testenv.RepoRoot(), "config", "prometheus")
	for _, args := range [][]string{{"check", "rules", "alerts.yaml"}, {"test", "rules", "alerts_test.yaml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
