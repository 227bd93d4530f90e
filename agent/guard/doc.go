// Package guard holds the agent's checks of what pods do on shared GPUs beyond what the sharing itself
// enforces, and what it does about them:
//   - the claim guard (claims.go, claimjudge.go): on GPUs sized per claim, the pods whose processes hold
//     more memory than their claims, by ledger group; WithinClaims, events, evictions under onExceed Evict;
//   - the unmanaged check (unmanaged.go): on shim GPUs and MPS GPUs sized per claim, a pod's process that
//     holds a context without being a client of what shares the GPU; status.gpus[].unmanaged, Managed,
//     events, gpusharing_unmanaged_processes, evictions under unmanagedProcesses Evict.
//
// agent/node runs both in its pass, from the accounting's snapshots (agent/accounting).
package guard
