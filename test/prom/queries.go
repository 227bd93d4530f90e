package prom

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"
)

// grafanaVars replaces the dashboard's variables as Grafana would for "All" and a 1m rate interval.
var grafanaVars = strings.NewReplacer("$node", ".*", "$namespace", ".*", "$__rate_interval", "1m")

// Query is one dashboard panel's or alert rule's expression.
type Query struct {
	// Where names it: "panel <title>" or "alert <name>".
	Where, Expr string
}

// PerPod is whether the query reads per-pod series, which must return data while pods use GPUs.
func (q Query) PerPod() bool { return strings.Contains(q.Expr, "gpusharing_pod_") }

// RulesFile is a Prometheus rule file (config/prometheus/alerts.yaml).
type RulesFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert string `json:"alert"`
			Expr  string `json:"expr"`
		} `json:"rules"`
	} `json:"groups"`
}

// DashboardAndAlertQueries lists every query of the Grafana dashboard (config/grafana/gpusharing.json,
// variables as Grafana fills them for "All") and every alert of config/prometheus/alerts.yaml.
func DashboardAndAlertQueries(repoRoot string) ([]Query, error) {
	var out []Query
	data, err := os.ReadFile(filepath.Join(repoRoot, "config", "grafana", "gpusharing.json"))
	if err != nil {
		return nil, err
	}
	var dash struct {
		Panels []struct {
			Title   string                  `json:"title"`
			Targets []struct{ Expr string } `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		return nil, err
	}
	for _, p := range dash.Panels {
		for _, q := range p.Targets {
			out = append(out, Query{"panel " + p.Title, grafanaVars.Replace(q.Expr)})
		}
	}
	data, err = os.ReadFile(filepath.Join(repoRoot, "config", "prometheus", "alerts.yaml"))
	if err != nil {
		return nil, err
	}
	var rules RulesFile
	if err := yaml.Unmarshal(data, &rules); err != nil {
		return nil, err
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			out = append(out, Query{"alert " + r.Alert, r.Expr})
		}
	}
	return out, nil
}
