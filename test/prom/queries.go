package prom

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
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

// Alert is whether the query is an alert rule's, which returns series only while the alert's condition
// holds.
func (q Query) Alert() bool { return strings.HasPrefix(q.Where, "alert ") }

// Inputs are the operands of the query's outermost comparison (>, <, >=, <=, ==, !=), less those that
// are numbers: what an alert compares, which must return series whether or not it fires. A query with no
// comparison outside parentheses is its own input.
func (q Query) Inputs() []string {
	depth, quoted := 0, false
	for i := 0; i < len(q.Expr); i++ {
		switch c := q.Expr[i]; {
		case c == '"':
			quoted = !quoted
		case quoted:
		case c == '(' || c == '{' || c == '[':
			depth++
		case c == ')' || c == '}' || c == ']':
			depth--
		case depth == 0 && strings.ContainsRune("<>=!", rune(c)):
			n := 1
			if i+1 < len(q.Expr) && q.Expr[i+1] == '=' {
				n = 2
			}
			if c == '=' && n == 1 || c == '!' && n == 1 {
				continue // not a comparison (a lone = or ! outside a matcher is no PromQL)
			}
			var out []string
			for _, side := range []string{q.Expr[:i], stripMatching(q.Expr[i+n:])} {
				if side = strings.TrimSpace(side); side != "" && !isNumber(side) {
					out = append(out, side)
				}
			}
			return out
		}
	}
	return []string{strings.TrimSpace(q.Expr)}
}

// stripMatching drops a comparison's leading bool modifier and on/ignoring/group_left/group_right clauses.
func stripMatching(s string) string {
	for {
		t := strings.TrimSpace(s)
		word, found := "", false
		for _, w := range []string{"bool", "on", "ignoring", "group_left", "group_right"} {
			if strings.HasPrefix(t, w) && (len(t) == len(w) || strings.ContainsRune(" (\n", rune(t[len(w)]))) {
				word, found = w, true
				break
			}
		}
		if !found {
			return t
		}
		t = strings.TrimSpace(t[len(word):])
		if word != "bool" && strings.HasPrefix(t, "(") {
			t = t[strings.IndexByte(t, ')')+1:]
		}
		s = t
	}
}

func isNumber(s string) bool {
	_, err := strconv.ParseFloat(s, 64)
	return err == nil
}
