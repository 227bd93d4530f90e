package gitops

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gpusharing/gpusharing/test/testenv"
)

// metricName finds gpusharing_ series names in a PromQL expression.
var metricName = regexp.MustCompile(`gpusharing_[a-z0-9_]+`)

// exported collects the metric names the Go code registers: Name fields of the prometheus options and
// the first argument of prometheus.NewDesc, in every non-test file under agent/, controllers/ and cmd/.
// It reads the source rather than scraping because histogram and labelled series appear on /metrics
// only after their first observation.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	decl := regexp.MustCompile(`(?:Name:\s*|NewDesc\()"(gpusharing_[a-z0-9_]+)"`)
	out := map[string]bool{}
	for _, dir := range []string{"agent", "controllers", "cmd"} {
		err := filepath.WalkDir(filepath.Join(testenv.RepoRoot(), dir), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range decl.FindAllStringSubmatch(string(b), -1) {
				out[m[1]] = true
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func TestEveryDashboardQueryNamesAMetricTheCodeExports(t *testing.T) {
	have := exported(t)
	if len(have) < 10 {
		t.Fatalf("found only %d metric declarations (%v); the scan is broken", len(have), have)
	}
	for _, path := range []string{
		filepath.Join(testenv.RepoRoot(), "config", "grafana", "gpusharing.json"),
		filepath.Join(testenv.RepoRoot(), "charts", "gpusharing", "files", "dashboards", "gpusharing.json"),
	} {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var dash struct {
			Panels []struct {
				Title   string `json:"title"`
				Targets []struct {
					Expr string `json:"expr"`
				} `json:"targets"`
			} `json:"panels"`
		}
		if err := json.Unmarshal(data, &dash); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(dash.Panels) == 0 {
			t.Fatalf("%s has no panels", path)
		}
		for _, p := range dash.Panels {
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, q := range p.Targets {
				names := metricName.FindAllString(q.Expr, -1)
				if len(names) == 0 {
					t.Errorf("panel %q: query %q names no gpusharing_ metric", p.Title, q.Expr)
				}
				for _, n := range names {
					// Histograms are queried through their _bucket, _sum and _count series.
					base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")
					if !have[n] && !have[base] {
						t.Errorf("panel %q: %s is not a metric the code exports", p.Title, n)
					}
				}
			}
		}
	}
}
