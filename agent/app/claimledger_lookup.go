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

// LedgerOfUID is the claim ledger the agent gives a client of the pod of UID uid, found without the API
// server where every claim records its pods' UIDs (ok false, found false otherwise: the agent then
// names the pod through the API server, LedgerOf).
func LedgerOfUID(claims []dra.SizedClaim, uid string) (cl scheduler.Claim, ok, found bool) {
	if !uidsRecorded(claims) {
		return scheduler.Claim{}, false, false
	}
	cl, ok = ledgerOfUID(claims, uid)
	return cl, ok, true
}
