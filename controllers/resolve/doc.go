// Package resolve holds the controller's pure decisions: which policies select which GPUs, which policy
// wins a GPU, whether a change disrupts running work, where a GPU stands against its desired sharing and
// how many nodes a rollout may disturb at once. Nothing here talks to the API server, so every rule is
// table-tested with plain values and both reconcilers share one definition of each.
package resolve
