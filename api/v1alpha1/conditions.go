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
	// ConditionWithinClaims is False on a GPU sized per claim while the processes of a claim's pods hold
	// more of its memory than the claims linking them were allocated (reason ClaimExceeded; the message
	// names the pods), Unknown while pods whose claims are not known yet hold some (ClaimsUnknown);
	// absent on other GPUs, and kept as last read while the agent cannot read the GPU's processes.
	ConditionWithinClaims = "WithinClaims"
	// ConditionManaged is False on a GPU checked for unmanaged processes (oversubscription, or MPS sized
	// per claim) while a pod's process holds a context there without being managed (reason
	// UnmanagedProcesses; status.gpus[].unmanaged names it), True otherwise (AllManaged); absent on other
	// GPUs, and kept as last read while the agent cannot read the GPU's processes.
	ConditionManaged = "Managed"
)

// Reasons. Each comment says where the reason surfaces and, after "What to do:", what the reader does about
// it; docs/reference/conditions.md is generated from them. A condition's reason and the event on its
// transition match.
const (
	// ReasonAsDesired: the GPU (or every GPU of the policy) runs the desired sharing. What to do: nothing.
	ReasonAsDesired = "AsDesired"
	// ReasonNoMatchingGPUs: the policy selects no GPU (Ready=False on the policy, not an error). What to do:
	// if it should select some, compare spec.nodeSelector with the nodes' labels and spec.gpus with the
	// GPUs each GPUNode's status lists; a node whose agent does not run has no GPUNode to match.
	ReasonNoMatchingGPUs = "NoMatchingGPUs"
	// ReasonApplying: the agent has not yet reported the desired sharing applied. What to do: wait; if it
	// stays, check that the node's agent runs (GPUNode Ready) and read its log.
	ReasonApplying = "Applying"
	// ReasonWaitingForRollout: a disruptive change waits because maxUnavailable nodes are already changing.
	// What to do: wait for the nodes in flight, or raise spec.rollout.maxUnavailable to change more at once.
	ReasonWaitingForRollout = "WaitingForRollout"
	// ReasonRolledOut: nothing is left to roll out. What to do: nothing.
	ReasonRolledOut = "RolledOut"
	// ReasonHardwareRejected: an agent reported a GPU it could not configure (the message names node and GPU).
	// What to do: read that GPU's Applied condition on its GPUNode (kubectl describe gpunode NODE) and act
	// on its reason.
	ReasonHardwareRejected = "HardwareRejected"
	// ReasonNoConflict: no other policy of equal priority selects the same GPUs. What to do: nothing.
	ReasonNoConflict = "NoConflict"
	// ReasonEqualPriority: another policy of equal priority selects some of the same GPUs; the oldest policy
	// (then the smallest name) wins them, and the message names the others. What to do: give one policy a
	// higher spec.priority, or narrow the selectors so they no longer overlap.
	ReasonEqualPriority = "EqualPriority"

	// ReasonGPUBusy: the agent refuses a disruptive change while processes use the GPU (pids in status).
	// What to do: end the processes listed in status.gpus[].processes (processes outside pods, or MPS
	// clients, which no drain reaches); the agent retries on every pass.
	ReasonGPUBusy = "GPUBusy"
	// ReasonLayoutDoesNotFit: the MIG layout cannot be placed on this GPU (the message names profile and free
	// slices); nothing was changed. What to do: pick profiles that fit together from the GPU's
	// status.gpus[].migProfiles (agent plan checks a layout against them), or narrow spec.gpus to the GPU
	// models the layout fits.
	ReasonLayoutDoesNotFit = "LayoutDoesNotFit"
	// ReasonNotMIGCapable: MIG was asked of a GPU without MIG. What to do: narrow spec.gpus to MIG-capable
	// GPUs (status.gpus[].migCapable), for example by products, or give this GPU another strategy.
	ReasonNotMIGCapable = "NotMIGCapable"
	// ReasonMIGModeChangePending: MIG mode was changed but takes effect only after a GPU reset. What to do:
	// reset the GPU once no process uses it (nvidia-smi -r -i INDEX) or reboot the node; the agent never
	// resets a GPU and converges after the reset.
	ReasonMIGModeChangePending = "MIGModeChangePending"
	// ReasonStrategyNeedsMIGDisabled: MPS or time-slicing was asked of a GPU whose MIG mode is enabled.
	// What to do: apply strategy Exclusive to the GPU first (the one strategy that turns MIG mode off),
	// then the strategy wanted.
	ReasonStrategyNeedsMIGDisabled = "StrategyNeedsMIGDisabled"
	// ReasonMPSOnMIG is the former name of ReasonStrategyNeedsMIGDisabled, which covers time-slicing too.
	//
	// Deprecated: use ReasonStrategyNeedsMIGDisabled.
	ReasonMPSOnMIG = ReasonStrategyNeedsMIGDisabled
	// ReasonInvalidSharing: the desired sharing cannot be applied by any agent (an unknown strategy, or
	// the strategy's block is missing); admission validation normally prevents it, so it waits for a
	// spec change and is not retried. What to do: correct the policy's spec.sharing as the message says,
	// and install the current CRDs, whose validation refuses such a policy.
	ReasonInvalidSharing = "InvalidSharing"
	// ReasonMPSDaemonFailed: the MPS control daemon did not start or keeps dying. What to do: read the
	// daemon's log (<mps-root>/<uuid>/log on the node) and the agent's; check that the agent finds
	// nvidia-cuda-mps-control (--driver-root, --mps-control).
	ReasonMPSDaemonFailed = "MPSDaemonFailed"
	// ReasonNVMLError: an NVML call failed; the message carries NVML's error string. What to do: check the
	// driver on the node (nvidia-smi); the agent retries on every pass.
	ReasonNVMLError = "NVMLError"
	// ReasonNVMLUnavailable: the node has no NVML library or driver (GPUNode Ready=False). What to do:
	// install the NVIDIA driver, or point --nvml-lib at libnvidia-ml.so.1; keep the agent off nodes
	// without GPUs (the DaemonSet's node selector).
	ReasonNVMLUnavailable = "NVMLUnavailable"
	// ReasonNoGPUs: NVML works but the node has no GPU (GPUNode Ready=True, nothing to apply). What to do:
	// nothing on a node without GPUs; otherwise check that the agent's container sees the GPUs' device
	// nodes.
	ReasonNoGPUs = "NoGPUs"
	// ReasonInventoryPublished: the agent runs and its inventory is current (GPUNode Ready=True). What to
	// do: nothing.
	ReasonInventoryPublished = "InventoryPublished"
	// ReasonCommandFailed: a host command (nvidia-smi, nvidia-cuda-mps-control) failed; the message has its
	// output. What to do: run the command by hand on the node to see why, and check the agent's
	// --nvidia-smi and --mps-control paths; the agent retries on its backoff.
	ReasonCommandFailed = "CommandFailed"
	// ReasonXidError: the GPU raised a critical Xid (GPU Healthy=False, the message names it); it stays
	// unhealthy until the agent restarts, and the device plugin stops advertising it. What to do: look the
	// Xid up in NVIDIA's Xid catalog, move the GPU's pods off, reset the GPU or reboot the node, then
	// restart the agent; an Xid that applications cause belongs in --health-ignored-xids.
	ReasonXidError = "XidError"
	// ReasonGPULost: NVML reports the GPU lost (GPU Healthy=False). What to do: drain the node and reboot
	// it, or have the hardware serviced; restart the agent after.
	ReasonGPULost = "GPULost"
	// ReasonNotDesired: no policy lists the GPU, so it is left as found. What to do: nothing, or select the
	// GPU with a policy to configure it.
	ReasonNotDesired = "NotDesired"

	// ReasonDraining: a disruptive change waits while the agent empties the GPU: it is cordoned (not
	// advertised) and its pods are waited for or evicted (GPU Applied=False; the message names the pods).
	// What to do: wait; with drain mode WaitForIdle, end the named pods or use mode Evict; an Evict drain
	// waits on the PodDisruptionBudgets the message names.
	ReasonDraining = "Draining"
	// ReasonDrainTimedOut: pods still used the GPU when the drain's timeout passed; the GPU was left as it
	// was and is advertised again (GPU Applied=False; the message names the pods and when the agent retries).
	// What to do: end or move the named pods, raise spec.rollout.drain.timeout, or use drain mode Evict;
	// the agent drains again at status.gpus[].drain.retryTime, or at once when the spec changes.
	ReasonDrainTimedOut = "DrainTimedOut"
	// ReasonDrainFailed: the drain stopped on an error waiting cannot fix, for example an eviction the API
	// server refuses for another reason than a PodDisruptionBudget (GPU Applied=False). What to do: fix
	// what the message and status.gpus[].drain.message name (for example the agent's permission to evict
	// pods); the agent retries at status.gpus[].drain.retryTime.
	ReasonDrainFailed = "DrainFailed"

	// ReasonSizedByClaim: the GPU's shares are sized per claim (sizing PerClaim), which only DRA can
	// carry, so the device plugin does not advertise the GPU (GPU DevicePlugin=False). What to do:
	// nothing; pods get the GPU through a ResourceClaim, or set sizing mode Fixed to offer it through the
	// device plugin.
	ReasonSizedByClaim = "SizedByClaim"
	// ReasonSizingDoesNotFit: sizing PerClaim asks for a memory step and minimum the GPU cannot hold
	// twice over (the least a device with consumable capacity must offer); the GPU is left as it was
	// (GPU Applied=False; the message names the sizes and the GPU's memory). What to do: lower
	// sizing.memoryStep or sizing.minMemory, or narrow spec.gpus to larger GPUs.
	ReasonSizingDoesNotFit = "SizingDoesNotFit"
	// ReasonAsClaimed: every pod on the sized GPU holds no more memory than its claims (GPU WithinClaims=True).
	// What to do: nothing.
	ReasonAsClaimed = "AsClaimed"
	// ReasonClaimExceeded: a pod's processes hold more of the sized GPU's memory than its claims were
	// allocated (GPU WithinClaims=False, a warning event on the pod; evicted with sizing onExceed Evict).
	// What to do: find how the named pod's processes escaped their limit (a process that dropped the shim
	// or set its own MPS limit), fix the workload or give its claim more memory; sizing.onExceed Evict
	// evicts such pods.
	ReasonClaimExceeded = "ClaimExceeded"
	// ReasonClaimsUnknown: processes of pods whose claims the agent does not know whole yet hold memory of
	// the sized GPU (a pod that started on a shared claim since the agent last read the node's claims, a
	// checkpoint that could not be read and an API server that does not answer); they are neither judged
	// nor evicted (GPU WithinClaims=Unknown; the message names them). What to do: usually nothing, the
	// agent reads the claims again; if it stays, check that the agent reaches the API server and may read
	// ResourceClaims.
	ReasonClaimsUnknown = "ClaimsUnknown"
	// ReasonAllManaged: every process of a pod on the GPU is managed there: a client of its shim scheduler
	// (oversubscription) or of its MPS server (MPS sized per claim) (GPU Managed=True). What to do: nothing.
	ReasonAllManaged = "AllManaged"
	// ReasonUnmanagedProcesses: a pod's process has held a context on the GPU past the agent's grace
	// without being managed: it dropped LD_PRELOAD, is a static binary, loaded the driver through dlmopen,
	// failed to connect to the scheduler, or bypassed the MPS server (GPU Managed=False, a warning event
	// on the pod; evicted with sharing.unmanagedProcesses Evict). Its memory and time on the GPU are
	// outside every lock, ledger and limit. What to do: run the named container's process with the
	// environment the pod was given (LD_PRELOAD and GPUSHARE_* for the shim, CUDA_MPS_PIPE_DIRECTORY for
	// MPS), or move it to a GPU of its own; sharing.unmanagedProcesses Evict evicts such pods.
	ReasonUnmanagedProcesses = "UnmanagedProcesses"
)

// Reasons on GPUSharingPolicy while it is deleted: its finalizer holds the object until the GPUs it
// configured are back on the default sharing (Exclusive), or until the controller's bound passes.
const (
	// ReasonRestoringDefault: the policy is being deleted and some of its GPUs do not yet run the default
	// (Ready=False and Progressing=True; the message names the first nodes and GPUs). What to do: wait;
	// if it stays, check the named nodes' agents (GPUNode Ready and Applied); the finalizer is released
	// after the manager's --restore-timeout anyway.
	ReasonRestoringDefault = "RestoringDefault"
	// ReasonDefaultRestored: every GPU the deleted policy configured reports the default applied; the
	// finalizer is released (an event). What to do: nothing.
	ReasonDefaultRestored = "DefaultRestored"
	// ReasonRestoreTimedOut: agents did not confirm the default within the bound, so the finalizer is
	// released anyway and the default stays in each GPUNode's spec for its agent to apply later (an event).
	// What to do: check the agents of the nodes whose GPUs did not confirm; each applies the default once
	// it runs again.
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
