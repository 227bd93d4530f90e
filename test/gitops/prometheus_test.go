package gitops

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/gpusharing/gpusharing/agent/accounting"
	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/agent/podpid"
	"github.com/gpusharing/gpusharing/test/prom"
	"github.com/gpusharing/gpusharing/test/testenv"
	"github.com/gpusharing/gpusharing/test/wait"
)

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
	queries, err := prom.DashboardAndAlertQueries(testenv.RepoRoot())
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range queries {
		perPod := q.PerPod()
		// A query that does not evaluate fails at once; a per-pod one waits for the scrape that serves it.
		var evalErr error
		err := wait.Poll(60*time.Second, func() error {
			res, err := p.Query(q.Expr)
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
			t.Errorf("%s: %q does not evaluate: %v", q.Where, q.Expr, evalErr)
		case err != nil:
			t.Errorf("%s: %q returns no series while pods use the GPU", q.Where, q.Expr)
		}
	}
	// A query that must fail to parse does, so the check above can fail.
	if _, err := p.Query("sum by (pod) (gpusharing_pod_gpu_memory_used_bytes"); err == nil {
		t.Error("Prometheus accepted a query that does not parse")
	}
}
