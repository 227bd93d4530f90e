package dra

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// The checkpoint lists the claims the kubelet plugin prepared, so that NodeUnprepareResources, which
// names a claim by uid only (the claim may be gone from the API server), is answered after an agent
// restart, and a repeated NodePrepareResources returns what the first one did.
//
// The plugin's in-memory checkpoint is always the one on disk: a change is made to a copy, the copy is
// written (a temporary file and a rename), and only then does the copy replace the record. A failed write
// leaves both as they were, so the kubelet's retry finds the claim still to prepare (or still to forget)
// and writes it then; a record that ran ahead of the file would answer the retry from memory and never
// write, and a restart would bring back a claim the kubelet had unprepared.
const (
	checkpointKind    = "gpusharing.io/dra-checkpoint"
	checkpointVersion = 1
)

type checkpoint struct {
	Kind    string                      `json:"kind"`
	Version int                         `json:"version"`
	Node    string                      `json:"node"`
	Claims  map[types.UID]preparedClaim `json:"claims"`
}

// preparedClaim is what one NodePrepareResources did for a claim.
type preparedClaim struct {
	Namespace string           `json:"namespace"`
	Name      string           `json:"name"`
	Devices   []preparedDevice `json:"devices"`
	// Pods are the names of the pods, in the claim's namespace, the claim was reserved for when it was
	// prepared (status.reservedFor): the consumers its size is exported and checked against.
	Pods []string `json:"pods,omitempty"`
	// PodUIDs are the UIDs of the same pods: what a process's cgroup names, so its claims are known
	// without the API server. Absent in a checkpoint written before they were recorded.
	PodUIDs []types.UID `json:"podUIDs,omitempty"`
	// Spec is the CDI spec written for the claim, kept so a spec file removed behind the plugin's back is
	// written again when the kubelet prepares the claim again.
	Spec cdispec.Spec `json:"spec"`
}

type preparedDevice struct {
	Requests     []string `json:"requests"`
	Pool         string   `json:"pool"`
	Device       string   `json:"device"`
	CDIDeviceIDs []string `json:"cdiDeviceIDs,omitempty"`
	// ShareID is the allocation's share of a sized device (many claims hold one device); absent before.
	ShareID *types.UID `json:"shareID,omitempty"`
	// GPU, MemoryBytes and ComputePercent are a sized device's GPU uuid and the amounts the allocation
	// consumes (its consumedCapacity); absent for every other device.
	GPU            string `json:"gpu,omitempty"`
	MemoryBytes    int64  `json:"memoryBytes,omitempty"`
	ComputePercent int64  `json:"computePercent,omitempty"`
	// MPSGPU is the GPU of an MPS share served by its claim's namespace's daemon (agent/mps): the daemon
	// runs while a prepared claim of the namespace names the GPU here. Absent for other devices, and for
	// MPS shares prepared to the GPU's own daemon.
	MPSGPU string `json:"mpsGPU,omitempty"`
	// Unit is the GPU's uuid, or the MIG instance's for an instance: what a device plugin pod holding
	// a device of it would hold too (agent/owner). Absent in a checkpoint written before it was recorded.
	Unit string `json:"unit,omitempty"`
}

// errCorruptCheckpoint: the file exists but is not a checkpoint this version of the agent wrote.
var errCorruptCheckpoint = errors.New("corrupt DRA checkpoint")

// readCheckpoint loads path; a missing file is an empty checkpoint (a first start).
func readCheckpoint(path, node string) (checkpoint, error) {
	cp := checkpoint{Kind: checkpointKind, Version: checkpointVersion, Node: node, Claims: map[types.UID]preparedClaim{}}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return cp, nil
	}
	if err != nil {
		return cp, fmt.Errorf("reading the DRA checkpoint %s: %w", path, err)
	}
	var got checkpoint
	if err := json.Unmarshal(data, &got); err != nil {
		return cp, fmt.Errorf("%w: %s: %v", errCorruptCheckpoint, path, err)
	}
	if got.Kind != checkpointKind || got.Version != checkpointVersion {
		return cp, fmt.Errorf("%w: %s is kind %q version %d, want %q version %d", errCorruptCheckpoint, path, got.Kind, got.Version, checkpointKind, checkpointVersion)
	}
	if got.Node != node {
		// A node's claims mean nothing on another node (a state directory copied with an image).
		return cp, fmt.Errorf("%w: %s was written for node %q, this is %q", errCorruptCheckpoint, path, got.Node, node)
	}
	if got.Claims == nil {
		got.Claims = map[types.UID]preparedClaim{}
	}
	return got, nil
}

// clone is a copy of cp whose claim map can change without changing cp. A preparedClaim is never changed
// once recorded (a claim is added or removed whole), so the entries are shared.
func (cp checkpoint) clone() checkpoint {
	out := cp
	out.Claims = make(map[types.UID]preparedClaim, len(cp.Claims))
	for uid, pc := range cp.Claims {
		out.Claims[uid] = pc
	}
	return out
}

// fileWriter writes a file whole or not at all (writeFileAtomic); the kubelet plugin writes its
// checkpoint through one, so a test can make the write fail.
type fileWriter func(path string, data []byte, perm os.FileMode) error

func writeCheckpoint(write fileWriter, path string, cp checkpoint) error {
	data, err := json.MarshalIndent(cp, "", "  ")
	if err != nil {
		return err
	}
	if err := write(path, data, 0o600); err != nil {
		return fmt.Errorf("writing the DRA checkpoint %s: %w", path, err)
	}
	return nil
}

// writeFileAtomic writes data to path through a temporary file in the same directory and a rename, so a
// reader (a restarted agent) sees the old file or the new one, never a torn one; the file and the
// directory are synced, so a claim the kubelet was told is prepared survives a power loss.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() { _ = os.Remove(tmp) }() // a no-op after the rename
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Chmod(perm); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	// The rename is durable once the directory is synced.
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}
