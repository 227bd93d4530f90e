package main

import (
	"context"
	"regexp"
	"strings"
)

// ledgerFigures are one claim ledger's series from the agent's metrics (docs/shim.md).
type ledgerFigures struct {
	processes                  int
	limit, granted, claimBytes int64
	refusals                   float64
}

var ledgerLine = regexp.MustCompile(`^(gpusharing_scheduler_ledger_\w+)\{([^}]*)\} (\S+)$`)

// ledger reads the ledger of claim key on this run's GPU from the agent's metrics.
func (s *stack) ledger(ctx context.Context, key string) ledgerFigures {
	text, _ := agentMetricsText(ctx) // unread: no ledger, which the checks report
	return parseLedger(text, s.gpuUUID, key)
}

// parseLedger finds the ledger of claim key on gpu in a metrics page (zero where it has none: no
// process in it).
func parseLedger(text, gpu, key string) ledgerFigures {
	var f ledgerFigures
	eachSample(text, ledgerLine, func(name string, labels map[string]string, v float64) {
		if labels["gpu"] != gpu || labels["claim"] != key {
			return
		}
		switch strings.TrimPrefix(name, "gpusharing_scheduler_ledger_") {
		case "processes":
			f.processes = int(v)
		case "limit_bytes":
			f.limit = int64(v)
		case "granted_bytes":
			f.granted = int64(v)
		case "claim_bytes":
			f.claimBytes = int64(v)
		case "refusals_total":
			f.refusals = v
		}
	})
	return f
}
