package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
)

// SharingHash identifies a desired sharing: the first 16 hex characters of the SHA-256 of its canonical
// JSON. The agent writes it into status.gpus[].applied.specHash once that sharing is in force, and the
// controller compares it with the hash of spec to tell that the agent has caught up.
func SharingHash(s Sharing) string {
	// encoding/json writes struct fields in declaration order and map keys sorted, and Quantity and
	// Duration marshal to their canonical strings, so equal sharings give equal bytes.
	b, err := json.Marshal(s)
	if err != nil {
		// Sharing holds only strings, numbers, quantities and durations, which always marshal.
		panic("v1alpha1: marshalling Sharing: " + err.Error())
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:16]
}
