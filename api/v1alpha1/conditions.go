package v1alpha1

import "slices"

// Condition types on GPUSharingPolicy (Ready also on GPUNode).
const (
	// ConditionReady on a GPUSharingPolicy is True when every GPU the policy wins reports its sharing
	// applied as desired. On a GPUNode it says whether the node's agent can serve: True while the agent
	// runs and its NVML inventory is current (InventoryPublished, NoGPUs), False when NVML is missing or
	// fails (NVMLUnavailable, NVMLError). Whether the node's GPUs run their sharing is the GPUNode's
	// Applied condition (the REASON column of kubectl get gpusharing).
	ConditionReady = "Ready"
	// ConditionProgressing is True while a change is still rolling out or waiting for its turn.
	ConditionProgressing = "Progressing"
	// ConditionDegraded is True when an agent reports that a GPU could not be configured as declared.
	ConditionDegraded = "Degraded"
	// ConditionConflicted is True when another policy of equal priority selects the same GPUs.
	ConditionConflicted = "Conflicted"
)

// Condition types for kstatus (sigs.k8s.io/cli-utils), which Flux, kpt and `kubectl wait` tooling read:
// both kinds carry them beside their own conditions, so generic tools tell "still working" from "stuck"
// without knowing gpusharing. Each is a summary of the kind's own conditions, never new information.
const (
	// ConditionReconciling is True while the change is still rolling out and nothing is stalled (on the
	// policy: Progressing is True; on a GPUNode: a listed GPU is being applied, drained or waits for its
	// pods). Its reason and message are those of the condition it summarizes.
	ConditionReconciling = "Reconciling"
	// ConditionStalled is True when the change cannot finish without someone acting: an agent reported a
	// hardware rejection, a drain that timed out or failed, an unhealthy GPU, or (GPUNode) NVML that
	// cannot be read. Its reason and message are the failure's.
	ConditionStalled = "Stalled"
)

// Condition types on GPUNode and on each GPU in its status.
const (
	// ConditionApplied is True when the GPU (or every listed GPU, on the node) runs its desired sharing.
	ConditionApplied = "Applied"
	// ConditionHealthy is False when NVML reports the GPU unhealthy (Xid errors, lost GPU).
	ConditionHealthy = "Healthy"
	// ConditionDevicePlugin on a GPU is False while the device plugin leaves the GPU out although it is
	// healthy and applied (reason SizedByClaim); absent otherwise.
	ConditionDevicePlugin = "DevicePlugin"
	// ConditionWithinClaims on a GPU sized per claim is False while the processes of a claim's pods hold
	// more of its memory than the claims linking them were allocated (reason ClaimExceeded; the message
	// names the pods), Unknown while pods whose claims are not known yet hold some (ClaimsUnknown);
	// absent on other GPUs, and kept as last read while the agent cannot read the GPU's processes.
	ConditionWithinClaims = "WithinClaims"
)

// Reasons. Each surfaces where its comment says; a condition's reason and the event on its transition match.
const (
	// ReasonAsDesired: the GPU (or every GPU of the policy) runs the desired sharing.
	ReasonAsDesired = "AsDesired"
	// ReasonNoMatchingGPUs: the policy selects no GPU (Ready=False on the policy, not an error).
	ReasonNoMatchingGPUs = "NoMatchingGPUs"
	// ReasonApplying: the agent has not yet reported the desired sharing applied.
	ReasonApplying = "Applying"
	// ReasonWaitingForRollout: a disruptive change waits because maxUnavailable nodes are already changing.
	ReasonWaitingForRollout = "WaitingForRollout"
	// ReasonRolledOut: nothing is left to roll out.
	ReasonRolledOut = "RolledOut"
	// ReasonHardwareRejected: an agent reported a GPU it could not configure (the message names node and GPU).
	ReasonHardwareRejected = "HardwareRejected"
	// ReasonNoConflict: no other policy of equal priority selects the same GPUs.
	ReasonNoConflict = "NoConflict"
	// ReasonEqualPriority: another policy of equal priority selects some of the same GPUs.
	ReasonEqualPriority = "EqualPriority"

	// ReasonGPUBusy: the agent refuses a disruptive change while processes use the GPU (pids in status).
	ReasonGPUBusy = "GPUBusy"
	// ReasonLayoutDoesNotFit: the MIG layout cannot be placed on this GPU (the message names profile and free slices).
	ReasonLayoutDoesNotFit = "LayoutDoesNotFit"
	// ReasonNotMIGCapable: MIG was asked of a GPU without MIG.
	ReasonNotMIGCapable = "NotMIGCapable"
	// ReasonMIGModeChangePending: MIG mode was changed but takes effect only after a GPU reset.
	ReasonMIGModeChangePending = "MIGModeChangePending"
	// ReasonStrategyNeedsMIGDisabled: MPS or time-slicing was asked of a GPU whose MIG mode is enabled.
	ReasonStrategyNeedsMIGDisabled = "StrategyNeedsMIGDisabled"
	// ReasonMPSOnMIG is the former name of ReasonStrategyNeedsMIGDisabled, which covers time-slicing too.
	//
	// Deprecated: use ReasonStrategyNeedsMIGDisabled.
	ReasonMPSOnMIG = ReasonStrategyNeedsMIGDisabled
	// ReasonInvalidSharing: the desired sharing cannot be applied by any agent (an unknown strategy, or
	// the strategy's block is missing); admission validation normally prevents it, so it waits for a
	// spec change and is not retried.
	ReasonInvalidSharing = "InvalidSharing"
	// ReasonMPSDaemonFailed: the MPS control daemon did not start or keeps dying.
	ReasonMPSDaemonFailed = "MPSDaemonFailed"
	// ReasonNVMLError: an NVML call failed; the message carries NVML's error string.
	ReasonNVMLError = "NVMLError"
	// ReasonNVMLUnavailable: the node has no NVML library or driver (GPUNode Ready=False).
	ReasonNVMLUnavailable = "NVMLUnavailable"
	// ReasonNoGPUs: NVML works but the node has no GPU (GPUNode Ready=True, nothing to apply).
	ReasonNoGPUs = "NoGPUs"
	// ReasonInventoryPublished: the agent runs and its inventory is current (GPUNode Ready=True).
	ReasonInventoryPublished = "InventoryPublished"
	// ReasonCommandFailed: a host command (nvidia-smi, nvidia-cuda-mps-control) failed; the message has its output.
	ReasonCommandFailed = "CommandFailed"
	// ReasonXidError: the GPU raised a critical Xid (GPU Healthy=False, the message names it); it stays
	// unhealthy until the agent restarts, and the device plugin stops advertising it.
	ReasonXidError = "XidError"
	// ReasonGPULost: NVML reports the GPU lost (GPU Healthy=False).
	ReasonGPULost = "GPULost"
	// ReasonNotDesired: no policy lists the GPU, so it is left as found.
	ReasonNotDesired = "NotDesired"

	// ReasonDraining: a disruptive change waits while the agent empties the GPU: it is cordoned (not
	// advertised) and its pods are waited for or evicted (GPU Applied=False; the message names the pods).
	ReasonDraining = "Draining"
	// ReasonDrainTimedOut: pods still used the GPU when the drain's timeout passed; the GPU was left as it
	// was and is advertised again (GPU Applied=False; the message names the pods and when the agent retries).
	ReasonDrainTimedOut = "DrainTimedOut"
	// ReasonDrainFailed: the drain stopped on an error waiting cannot fix, for example an eviction the API
	// server refuses for another reason than a PodDisruptionBudget (GPU Applied=False).
	ReasonDrainFailed = "DrainFailed"

	// ReasonSizedByClaim: the GPU's shares are sized per claim (sizing PerClaim), which only DRA can
	// carry, so the device plugin does not advertise the GPU (GPU DevicePlugin=False).
	ReasonSizedByClaim = "SizedByClaim"
	// ReasonSizingDoesNotFit: sizing PerClaim asks for a memory step and minimum the GPU cannot hold
	// twice over (the least a device with consumable capacity must offer); the GPU is left as it was
	// (GPU Applied=False; the message names the sizes and the GPU's memory).
	ReasonSizingDoesNotFit = "SizingDoesNotFit"
	// ReasonAsClaimed: every pod on the sized GPU holds no more memory than its claims (GPU WithinClaims=True).
	ReasonAsClaimed = "AsClaimed"
	// ReasonClaimExceeded: a pod's processes hold more of the sized GPU's memory than its claims were
	// allocated (GPU WithinClaims=False, a warning event on the pod; evicted with sizing onExceed Evict).
	ReasonClaimExceeded = "ClaimExceeded"
	// ReasonClaimsUnknown: processes of pods whose claims the agent does not know whole yet hold memory of
	// the sized GPU (a pod that started on a shared claim since the agent last read the node's claims, a
	// checkpoint that could not be read and an API server that does not answer); they are neither judged
	// nor evicted (GPU WithinClaims=Unknown; the message names them).
	ReasonClaimsUnknown = "ClaimsUnknown"
)

// Reasons on GPUSharingPolicy while it is deleted: its finalizer holds the object until the GPUs it
// configured are back on the default sharing (Exclusive), or until the controller's bound passes.
const (
	// ReasonRestoringDefault: the policy is being deleted and some of its GPUs do not yet run the default
	// (Ready=False and Progressing=True; the message names the first nodes and GPUs).
	ReasonRestoringDefault = "RestoringDefault"
	// ReasonDefaultRestored: every GPU the deleted policy configured reports the default applied; the
	// finalizer is released (an event).
	ReasonDefaultRestored = "DefaultRestored"
	// ReasonRestoreTimedOut: agents did not confirm the default within the bound, so the finalizer is
	// released anyway and the default stays in each GPUNode's spec for its agent to apply later (an event).
	ReasonRestoreTimedOut = "RestoreTimedOut"
)

// hardwareRejections are the agent's Applied=False reasons that mean "this cannot be done here" rather
// than "not done yet"; GPUBusy, Draining and Applying are not among them, work is simply in progress. A
// drain that timed out or failed left the GPU as it was: that is reported (Degraded, Stalled) while the
// agent retries on its own backoff. This is the only list: the agent's Stalled, the controller's Degraded
// and the Argo CD health check of GPUNode (config/argocd, checked against it by test/gitops) read it.
var hardwareRejections = []string{
	ReasonCommandFailed,
	ReasonDrainFailed,
	ReasonDrainTimedOut,
	ReasonInvalidSharing,
	ReasonLayoutDoesNotFit,
	ReasonMIGModeChangePending,
	ReasonMPSDaemonFailed,
	ReasonNVMLError,
	ReasonNotMIGCapable,
	ReasonSizingDoesNotFit,
	ReasonStrategyNeedsMIGDisabled,
}

// HardwareRejectionReasons lists, sorted, the Applied=False reasons IsHardwareRejection accepts: those
// that mean the GPU cannot take its desired sharing until someone acts. Readers of a status written by an
// agent that did not yet write Stalled derive "stalled" from a GPU's Applied reason with it.
func HardwareRejectionReasons() []string { return slices.Clone(hardwareRejections) }

// IsHardwareRejection says whether an Applied=False reason means the GPU cannot take its desired sharing
// until someone acts (the controller's Degraded and both kinds' Stalled), rather than work in progress.
func IsHardwareRejection(reason string) bool { return slices.Contains(hardwareRejections, reason) }
