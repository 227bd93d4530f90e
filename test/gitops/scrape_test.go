package gitops

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/setup"
	"github.com/gpusharing/gpusharing/test/simnode"
	"github.com/gpusharing/gpusharing/test/testenv"
	"github.com/gpusharing/gpusharing/test/wait"
)

// eventOnly are the dashboard's series that exist only after an event this test does not cause: a shim
// client connecting (per-client memory and swaps), a drain (drain durations, tested in agent/app), an
// MPS daemon restart, a process of a pod using a GPU (the per-pod accounting series, tested in
// agent/accounting). They must still be declared by the code
// (TestEveryDashboardQueryNamesAMetricTheCodeExports). The scheduler's per-GPU lock series (wait, hold,
// hand-offs, revocations, evictions) are served as soon as a GPU's scheduler runs, so they are checked.
var eventOnly = map[string]bool{
	"gpusharing_scheduler_client_resident_bytes":     true,
	"gpusharing_scheduler_client_swapped_bytes":      true,
	"gpusharing_scheduler_client_swaps_total":        true,
	"gpusharing_scheduler_client_swap_bytes_total":   true,
	"gpusharing_scheduler_client_swap_seconds_total": true,
	"gpusharing_agent_drain_duration_seconds":        true,
	"gpusharing_agent_mps_daemon_restarts":           true,
	"gpusharing_pod_gpu_memory_used_bytes":           true,
	"gpusharing_pod_gpu_sm_utilization_percent":      true,
	"gpusharing_pod_shim_lock_wait_seconds_total":    true,
	"gpusharing_pod_shim_swapped_bytes":              true,
}

// dashboardMetrics lists the gpusharing_ series the dashboard queries, histogram suffixes removed.
func dashboardMetrics(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "grafana", "gpusharing.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Targets []struct{ Expr string } `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatal(err)
	}
	set := map[string]bool{}
	for _, p := range dash.Panels {
		for _, q := range p.Targets {
			for _, n := range metricName.FindAllString(q.Expr, -1) {
				set[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")] = true
			}
		}
	}
	var out []string
	for n := range set {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// scrape GETs a /metrics endpoint and returns the series names it exposes.
func scrape(t *testing.T, url string) map[string]bool {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line := regexp.MustCompile(`^(gpusharing_[a-z0-9_]+?)(_bucket|_sum|_count)?[{ ]`)
	out := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if m := line.FindStringSubmatch(sc.Text()); m != nil {
			out[m[1]] = true
		}
	}
	return out
}

// scrapeRuns numbers this test's runs in one process (go test -count): each names its node, pool and
// policy (and its GPUs' UUIDs) of its own, since the objects of an earlier run stay in the API server.
var scrapeRuns atomic.Int32

// The controller and a simulated node's real agent run in this process against the API server and
// converge a time-slicing policy with oversubscription (so the shim scheduler runs); their shared
// registry is served over HTTP as their /metrics endpoints serve it, and scraped.
func TestTheDashboardsSeriesAreServedByARunningManagerAndAgent(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 2)
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := setup.Controllers(ctx, mgr, setup.Options{SkipNameValidation: true}); err != nil {
		t.Fatal(err)
	}
	go func() {
		if err := mgr.Start(ctx); err != nil {
			errs <- err
		}
	}()
	r := scrapeRuns.Add(1)
	pool := fmt.Sprintf("scrape-r%d", r)
	n := simnode.Node{Name: pool + "-node", Model: "H100", GPUs: 1, Labels: map[string]string{"pool": pool}, Seq: 90 + int(r)}
	simnode.StartForTest(t, ctx, env.Client, env.Config, env.Scheme, n, errs)
	p := &v1.GPUSharingPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: pool + "-oversub"},
		Spec: v1.GPUSharingPolicySpec{
			NodeSelector: &v1.NodeSelector{MatchLabels: map[string]v1.LabelValue{"pool": v1.LabelValue(pool)}},
			Sharing: v1.Sharing{Strategy: v1.StrategyTimeSlicing, TimeSlicing: &v1.TimeSlicingSharing{Replicas: 2},
				Oversubscription: &v1.Oversubscription{}},
		},
	}
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	wait.UntilState(t, 60*time.Second, func() (bool, string) {
		select {
		case err := <-errs:
			t.Fatal(err)
		default:
		}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
			t.Fatal(err)
		}
		return meta.IsStatusConditionTrue(p.Status.Conditions, v1.ConditionReady), fmt.Sprintf("%+v", p.Status.Conditions)
	}, "the policy Ready")

	srv := httptest.NewServer(promhttp.HandlerFor(metrics.Registry, promhttp.HandlerOpts{}))
	defer srv.Close()
	// The policy's status pass and the agent's pass record their gauges right after their writes: wait
	// until the last pass recorded them.
	var got map[string]bool
	wait.UntilState(t, 30*time.Second, func() (bool, string) {
		var missing []string
		got = scrape(t, srv.URL)
		for _, name := range dashboardMetrics(t) {
			if !got[name] && !eventOnly[name] {
				missing = append(missing, name)
			}
		}
		return len(missing) == 0, fmt.Sprintf("not served: %v", missing)
	}, "the running manager and agent serve every series the dashboard queries")
	// The event-only list must not hide series that are in fact always there.
	for name := range eventOnly {
		if got[name] {
			t.Logf("%s is served already (listed as event-only)", name)
		}
	}
	for _, name := range []string{"gpusharing_agent_gpu_sharing_info", "gpusharing_scheduler_budget_bytes", "gpusharing_policy_gpus"} {
		if !got[name] {
			t.Errorf("%s is not served; the dashboard's core panels would be empty", name)
		}
	}
}
