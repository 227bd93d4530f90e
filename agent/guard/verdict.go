package guard

import (
	"github.com/gpusharing/gpusharing/agent/accounting"
	"github.com/gpusharing/gpusharing/agent/dra"
)

// ClaimVerdict is the guard's judgement of one ledger group over its claims on a GPU, for checkers
// outside the agent (test/soak): Pods are the group's pods with memory there, Culprits those the guard
// would evict, as "namespace/name".
type ClaimVerdict struct {
	Pods, Culprits []string
	Used, Claimed  int64
}

// JudgeClaims is the guard's judgement (judgeClaims) of one GPU's account against claims that are all
// known: the groups over their claims, sorted.
func JudgeClaims(claims []dra.SizedClaim, acct accounting.GPU) []ClaimVerdict {
	over, _ := judgeClaims(claimKnowledge{claims: claims, whole: true}, acct, nil, nil)
	out := make([]ClaimVerdict, 0, len(over))
	for _, o := range over {
		v := ClaimVerdict{Used: o.used, Claimed: o.claimed}
		for _, p := range o.pods {
			v.Pods = append(v.Pods, p.String())
		}
		for _, p := range o.culprits {
			v.Culprits = append(v.Culprits, p.String())
		}
		out = append(out, v)
	}
	return out
}
