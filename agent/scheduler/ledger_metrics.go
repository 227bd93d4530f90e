package scheduler

import "github.com/prometheus/client_golang/prometheus"

// The claim ledgers' series (ledger.go), read from the schedulers at each scrape, so a ledger's series
// leave with its last process.
var (
	ledgerLabels    = []string{"gpu", "claim"}
	descLedgerLimit = prometheus.NewDesc("gpusharing_scheduler_ledger_limit_bytes",
		"What the allocations of a claim's processes on a GPU may reach together: the claim less each connected process's context charge (R until NVML measures it).", ledgerLabels, nil)
	descLedgerGranted = prometheus.NewDesc("gpusharing_scheduler_ledger_granted_bytes",
		"Device memory the scheduler granted a claim's processes on a GPU for their allocations.", ledgerLabels, nil)
	descLedgerClaim = prometheus.NewDesc("gpusharing_scheduler_ledger_claim_bytes",
		"A claim's memory on a GPU (M), as the claim guard judges it: NVML's count, contexts included.", ledgerLabels, nil)
	descLedgerProcs = prometheus.NewDesc("gpusharing_scheduler_ledger_processes",
		"Connected shim processes of a claim on a GPU (n).", ledgerLabels, nil)
	descLedgerRefused = prometheus.NewDesc("gpusharing_scheduler_ledger_refusals_total",
		"Charges a claim's ledger refused (each fails an allocation with out of memory), while the ledger lives.", ledgerLabels, nil)
)

type ledgerCollector struct{ m *Metrics }

func (c *ledgerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLedgerLimit, descLedgerGranted, descLedgerClaim, descLedgerProcs, descLedgerRefused} {
		ch <- d
	}
}

func (c *ledgerCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.m.attached() {
		for _, l := range s.Ledgers() {
			ch <- prometheus.MustNewConstMetric(descLedgerLimit, prometheus.GaugeValue, float64(l.Total), l.GPU, l.Key)
			ch <- prometheus.MustNewConstMetric(descLedgerGranted, prometheus.GaugeValue, float64(l.Granted), l.GPU, l.Key)
			ch <- prometheus.MustNewConstMetric(descLedgerClaim, prometheus.GaugeValue, float64(l.Claim), l.GPU, l.Key)
			ch <- prometheus.MustNewConstMetric(descLedgerProcs, prometheus.GaugeValue, float64(l.Processes), l.GPU, l.Key)
			ch <- prometheus.MustNewConstMetric(descLedgerRefused, prometheus.CounterValue, float64(l.Refusals), l.GPU, l.Key)
		}
	}
}
