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

// judge is the guard's judgement of GPU uuid, whose pods hold used (bytes by pod name), the unledgered
// ones through a process that dropped the shim (one process per pod stands for its processes: a shim
// client, or none for an unledgered pod).
func judge(claims []dra.SizedClaim, uuid string, used map[string]int64, unledgered map[string]bool) []verdict {
	acct := accounting.GPU{UUID: uuid, At: time.Now(), ProcessesRead: true}
	pid := int32(0)
	for name, b := range used {
		pid++
		proc := accounting.Process{PID: pid, MemoryBytes: uint64(b), MemoryKnown: true}
		if !unledgered[name] {
			proc.Shim = &accounting.ShimUsage{}
		}
		acct.Processes = append(acct.Processes, proc)
		acct.Containers = append(acct.Containers, accounting.Container{
			Ref: podpid.Ref{Namespace: namespace, Name: name, Container: "main", UID: name}, PIDs: []int32{pid}, MemoryBytes: uint64(b), MemoryComplete: true})
	}
	return guard.JudgeClaims(claims, acct)
}
