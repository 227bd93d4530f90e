package policy

import (
	"time"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
)

// progressWriteDelay says how long to hold back a status write that only reports progress (counts and
// condition messages; the observed generation and every condition's type, status and reason unchanged):
// the time left of interval since the policy's last status write, or 0 to write now. Anything a client
// waits on (a condition turning, a new generation observed) is written at once; during a rollout the
// counts move with every ack, and writing each move would spend the API server's throughput on a number
// nobody waits for (at 1,000 nodes on a saturated server, a tenth of all writes).
func progressWriteDelay(old, now *v1.GPUSharingPolicyStatus, last, at time.Time, interval time.Duration) time.Duration {
	if interval <= 0 || last.IsZero() || !progressOnly(old, now) {
		return 0
	}
	return max(0, interval-at.Sub(last))
}

func progressOnly(old, now *v1.GPUSharingPolicyStatus) bool {
	if old.ObservedGeneration != now.ObservedGeneration || len(old.Conditions) != len(now.Conditions) {
		return false
	}
	for i := range now.Conditions {
		o, n := &old.Conditions[i], &now.Conditions[i]
		if o.Type != n.Type || o.Status != n.Status || o.Reason != n.Reason || o.ObservedGeneration != n.ObservedGeneration {
			return false
		}
	}
	return true
}
