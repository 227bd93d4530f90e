package prom

import (
	"reflect"
	"testing"
)

func TestInputsAreTheOperandsOfTheOutermostComparison(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`sum by (policy) (gpusharing_policy_gpus{state="degraded"}) > 0`, []string{`sum by (policy) (gpusharing_policy_gpus{state="degraded"})`}},
		{"sum by (a) (x)\n  > on (a, b)\nsum by (a) (y)", []string{"sum by (a) (x)", "sum by (a) (y)"}},
		{`rate(x{l=~"a|b",m!="c>d"}[5m]) >= bool 0.5`, []string{`rate(x{l=~"a|b",m!="c>d"}[5m])`}},
		{`x > ignoring (g) group_left (h) y`, []string{"x", "y"}},
		{`1 < x`, []string{"x"}},
		{`histogram_quantile(0.5, sum by (le) (rate(x_bucket[1m])))`, []string{`histogram_quantile(0.5, sum by (le) (rate(x_bucket[1m])))`}},
		{`a != b`, []string{"a", "b"}},
	} {
		if got := (Query{Expr: tc.expr}).Inputs(); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Inputs(%q) = %q, want %q", tc.expr, got, tc.want)
		}
	}
}
