package app

import (
	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/scheduler"
)

// LedgerOf is the claim ledger the agent gives a client of pod namespace/name among one GPU's sized
// claims (ledgerOf), for checkers outside the agent that run a scheduler with the agent's ledgers
// (test/soak).
func LedgerOf(claims []dra.SizedClaim, namespace, name string) (scheduler.Claim, bool) {
	return ledgerOf(claims, namespace, name)
}
