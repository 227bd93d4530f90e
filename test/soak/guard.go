package soak

// The one place the soak calls the claim guard's judgement (agent/node), so that it follows the guard
// wherever it lives.

import (
	"time"

	"github.com/gpusharing/gpusharing/agent/accounting"
	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/guard"
	"github.com/gpusharing/gpusharing/agent/podpid"
)

// verdict is the guard's judgement of one group over its claims.
type verdict = guard.ClaimVerdict

// judge is the guard's judgement of GPU uuid, whose pods hold used (bytes by pod name).
func judge(claims []dra.SizedClaim, uuid string, used map[string]int64) []verdict {
	acct := accounting.GPU{UUID: uuid, At: time.Now(), ProcessesRead: true}
	for name, b := range used {
		acct.Containers = append(acct.Containers, accounting.Container{
			Ref: podpid.Ref{Namespace: namespace, Name: name, Container: "main", UID: name}, MemoryBytes: uint64(b), MemoryComplete: true})
	}
	return guard.JudgeClaims(claims, acct)
}
