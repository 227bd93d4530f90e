// Package deviceid is the one definition of the device IDs the agent's device plugin advertises to the
// kubelet and reads back from its PodResources API: a whole GPU or MIG instance is its uuid, a replica
// of a shared GPU is "<gpu-uuid>::<n>". The device plugin formats them and the drain parses them, both
// here, so neither re-encodes the other's spelling.
package deviceid

import (
	"strconv"
	"strings"
)

// Separator joins a GPU's uuid and a replica number: GPU-1234::0.
const Separator = "::"

// ID is a parsed device ID.
type ID struct {
	// UUID is the GPU's uuid for a replica, else the GPU or MIG instance's uuid.
	UUID string
	// Replica is the replica number; meaningful only when IsReplica.
	Replica int32
	// IsReplica says the ID names a share of a GPU rather than a whole device.
	IsReplica bool
}

// Whole is the ID of a whole GPU or MIG instance.
func Whole(uuid string) ID { return ID{UUID: uuid} }

// Replica is the ID of replica n of a GPU.
func Replica(gpuUUID string, n int32) ID { return ID{UUID: gpuUUID, Replica: n, IsReplica: true} }

// String formats the ID as the kubelet sees it.
func (id ID) String() string {
	if !id.IsReplica {
		return id.UUID
	}
	return id.UUID + Separator + strconv.Itoa(int(id.Replica))
}

// Parse reads a device ID. It never fails: an ID without the separator, or whose replica is not a
// number, names a whole device (kubelets may hold IDs of other plugins, which are uuids or opaque).
func Parse(s string) ID {
	uuid, rest, ok := strings.Cut(s, Separator)
	if !ok {
		return Whole(s)
	}
	n, err := strconv.ParseInt(rest, 10, 32)
	if err != nil || n < 0 {
		return ID{UUID: uuid}
	}
	return Replica(uuid, int32(n))
}
