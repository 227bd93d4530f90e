package gitops

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/yaml"

	"github.com/gpusharing/gpusharing/agent/accounting"
	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/agent/podpid"
	"github.com/gpusharing/gpusharing/test/prom"
	"github.com/gpusharing/gpusharing/test/testenv"
	"github.com/gpusharing/gpusharing/test/wait"
)

// grafanaVars replaces the dashboard's variables as Grafana would for "All" and a 1m rate interval.
var grafanaVars = strings.NewReplacer("$node", ".*", "$namespace", ".*", "$__rate_interval", "1m")

type query struct{ where, expr string }

func dashboardAndAlertQueries(t *testing.T) []query {
	t.Helper()
	var out []query
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "grafana", "gpusharing.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string                  `json:"title"`
			Targets []struct{ Expr string } `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatal(err)
	}
	for _, p := range dash.Panels {
		for _, q := range p.Targets {
			out = append(out, query{"panel " + p.Title, grafanaVars.Replace(q.Expr)})
		}
	}
	data, err = os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "prometheus", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rules rulesFile
	if err := yaml.Unmarshal(data, &rules); err != nil {
		t.Fatal(err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			out = append(out, query{"alert " + r.Alert, r.Expr})
		}
	}
	return out
}

type podTable map[int32]podpid.Ref

func (p podTable) Refs(_ context.Context, pids []int32) map[int32]podpid.Ref {
	out := map[int32]podpid.Ref{}
	for _, pid := range pids {
		if r, ok := p[pid]; ok {
			out[pid] = r
		}
	}
	return out
}

type shimTable map[string][]accounting.ShimClient

func (s shimTable) ShimClients(uuid string) []accounting.ShimClient { return s[uuid] }

type claimTable []dra.SizedClaim

func (c claimTable) SizedClaims() []dra.SizedClaim { return c }

// TestEveryDashboardAndAlertQueryEvaluatesInPrometheus scrapes this process's metrics registry (the
// manager's and agent's series as registered in code, and the accounting's collector over a mock GPU
// whose two processes are named as pods, one a shim client, and the sized claims' collector, the first
// pod's claim smaller than what it uses) with a real Prometheus, and evaluates every
// dashboard and alert query through its HTTP API: each must parse, and the per-pod ones must return
// series.
func TestEveryDashboardAndAlertQueryEvaluatesInPrometheus(t *testing.T) {
	if prom.Binary() == "" {
		t.Skip("prometheus is not installed (apt-get install prometheus)")
	}
	srv := nvmlmock.NewH100(1)
	g0 := srv.GPUs[0]
	g0.SetUsage(nvmlmock.Proc(100, 6<<30, 80), nvmlmock.Proc(200, 3<<30, 20))
	acct := &accounting.Accountant{
		GPUs: gpu.NewNVML(srv),
		Pods: podTable{100: {Namespace: "ml", Name: "train", Container: "main"}, 200: {Namespace: "ml", Name: "serve", Container: "main"}},
		Shim: shimTable{g0.UUID: {{PID: 200, LockWait: 2 * time.Second, LockHold: 3 * time.Second, SwappedBytes: 1 << 30}}},
	}
	m, err := accounting.NewMetrics(metrics.Registry)
	if err != nil {
		t.Fatal(err)
	}
	m.Add("prom-node", acct)
	cm, err := dra.NewClaimMetrics(metrics.Registry)
	if err != nil {
		t.Fatal(err)
	}
	// train uses 6 GiB of a 4 GiB claim: the claim alert's query has a pod to return.
	cm.Add("prom-node", claimTable{{Namespace: "ml", Name: "train-gpu", Pods: []string{"train"}, GPU: g0.UUID, MemoryBytes: 4 << 30, ComputePercent: 50}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Reads keep coming, as the agent's would, so counters move and rates have two points.
	go func() {
		for ctx.Err() == nil {
			g0.AdvanceSamples(500_000)
			acct.Sample(ctx)
			time.Sleep(200 * time.Millisecond)
		}
	}()

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: promhttp.HandlerFor(metrics.Registry, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(l) }()
	defer func() { _ = hs.Close() }()

	p := prom.Start(t, prom.Target{Job: "gpusharing", Addr: l.Addr().String()})
	p.TargetsUp(t, 60*time.Second)
	queries := dashboardAndAlertQueries(t)
	for _, q := range queries {
		perPod := strings.Contains(q.expr, "gpusharing_pod_")
		// A query that does not evaluate fails at once; a per-pod one waits for the scrape that serves it.
		var evalErr error
		err := wait.Poll(60*time.Second, func() error {
			res, err := p.Query(q.expr)
			if err != nil {
				evalErr = err
				return nil
			}
			if perPod && len(res) == 0 {
				return errors.New("no series yet")
			}
			return nil
		})
		switch {
		case evalErr != nil:
			t.Errorf("%s: %q does not evaluate: %v", q.where, q.expr, evalErr)
		case err != nil:
			t.Errorf("%s: %q returns no series while pods use the GPU", q.where, q.expr)
		}
	}
	// A query that must fail to parse does, so the check above can fail.
	if _, err := p.Query("sum by (pod) (gpusharing_pod_gpu_memory_used_bytes"); err == nil {
		t.Error("Prometheus accepted a query that does not parse")
	}
}
