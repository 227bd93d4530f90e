package main

import (
	"io"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// ledgerSamples serves the scheduler's ledger series, as its collector names and labels them, for two
// claims on two GPUs.
type ledgerSamples struct{}

func (ledgerSamples) Describe(chan<- *prometheus.Desc) {}

func (ledgerSamples) Collect(ch chan<- prometheus.Metric) {
	labels := []string{"gpu", "claim"}
	for _, s := range []struct {
		gpu, claim string
		scale      float64
	}{{"GPU-a", "default/sized-shim-two", 1}, {"GPU-a", "default/other", 3}, {"GPU-b", "default/sized-shim-two", 5}} {
		for _, m := range []struct {
			name string
			kind prometheus.ValueType
			v    float64
		}{
			{"gpusharing_scheduler_ledger_limit_bytes", prometheus.GaugeValue, 2560 << 20},
			{"gpusharing_scheduler_ledger_granted_bytes", prometheus.GaugeValue, 2496 << 20},
			{"gpusharing_scheduler_ledger_claim_bytes", prometheus.GaugeValue, 4 << 30},
			{"gpusharing_scheduler_ledger_processes", prometheus.GaugeValue, 2},
			{"gpusharing_scheduler_ledger_refusals_total", prometheus.CounterValue, 7},
		} {
			ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(m.name, "h", labels, nil), m.kind, m.v*s.scale, s.gpu, s.claim)
		}
	}
}

// The ledger check reads one claim's ledger on the run's GPU from the agent's metrics page, as the
// Prometheus client writes it (large figures in exponent form, a counter's _total).
func TestParseLedgerReadsOneClaimOnOneGPUFromAMetricsPage(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(ledgerSamples{})
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	got := parseLedger(string(body), "GPU-a", "default/sized-shim-two")
	want := ledgerFigures{processes: 2, limit: 2560 << 20, granted: 2496 << 20, claimBytes: 4 << 30, refusals: 7}
	if got != want {
		t.Errorf("parseLedger = %+v, want %+v; page:\n%s", got, want, body)
	}
	if none := parseLedger(string(body), "GPU-a", "default/gone"); none != (ledgerFigures{}) {
		t.Errorf("a claim without a ledger: %+v, want zero", none)
	}
}
