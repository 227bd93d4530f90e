package app

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpusharing/gpusharing/agent/hostpath"
	"github.com/gpusharing/gpusharing/agent/scheduler"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/shimclient"
)

func oversubscribedTimeSlicing(replicas int32, quantum time.Duration, budget string) v1alpha1.Sharing {
	s := timeSlicing(replicas)
	q := resource.MustParse(budget)
	s.Oversubscription = &v1alpha1.Oversubscription{TimeQuantum: &metav1.Duration{Duration: quantum}, AntiThrashing: v1alpha1.AntiThrashingAuto, MemoryBudget: &q}
	return s
}

// shimClients is a waitFor check on the GPU's applied.shim: the quantum and how many clients, how many holding.
func shimClients(uuid string, quantum time.Duration, clients, holding int) func(*v1alpha1.GPUNode) (bool, string) {
	return func(g *v1alpha1.GPUNode) (bool, string) {
		st := gpuState(g, uuid)
		if st == nil || st.Applied == nil || st.Applied.Shim == nil {
			return false, "no applied.shim"
		}
		sh := st.Applied.Shim
		h := 0
		for _, c := range sh.Clients {
			if c.PID != int32(os.Getpid()) {
				return false, fmt.Sprintf("client pid %d, want this process's %d", c.PID, os.Getpid())
			}
			if c.Holding {
				h++
			}
		}
		return sh.TimeQuantum != nil && sh.TimeQuantum.Duration == quantum && len(sh.Clients) == clients && h == holding,
			fmt.Sprintf("applied.shim: quantum %v, clients %+v", sh.TimeQuantum, sh.Clients)
	}
}

// The whole agent: a GPU whose policy adds oversubscription to time-slicing gets its scheduler on the
// socket the device plugin hands to pods (GPUSHARE_SOCKET in the mounted directory, GPUSHARE_OVERSUB=1);
// clients connecting and leaving reach status without waiting for the resync (a minute here, longer
// than any wait below); a quantum change reaches status; leaving oversubscription stops the scheduler,
// removes its socket and advertises plain time-slice replicas again.
func TestAgentRunsTheSchedulerOfAnOversubscribedGPUWhereThePodsSocketPoints(t *testing.T) {
	n := startNode(t, 1)
	uuid := n.uuid(0)
	n.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Index: 0, Sharing: oversubscribedTimeSlicing(2, 3*time.Second, "8Gi")})
	g := n.waitFor(t, "GPU 0 time-sliced with oversubscription", appliedAsDesired(uuid))
	if sh := gpuState(g, uuid).Applied.Shim; sh == nil || sh.MemoryBudget == nil || sh.MemoryBudget.Value() != 8<<30 {
		t.Fatalf("applied.shim = %+v, want the 8Gi budget", sh)
	}
	n.waitDevices(t, "shim shares of GPU 0", "gpusharing.io/gpu-shared", replicas(uuid, 2, nil))
	n.waitDevices(t, "no plain time-slice replicas", "gpusharing.io/gpu-timeslice", nil)

	plugin, err := n.kubelet.Dial("gpusharing.io/gpu-shared")
	if err != nil {
		t.Fatal(err)
	}
	defer plugin.Close()
	resp, err := plugin.AllocateOne(context.Background(), share.ReplicaID(uuid, 1))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Envs["GPUSHARE_OVERSUB"] != "1" || resp.Envs["GPUSHARE_GPU_UUID"] != uuid {
		t.Errorf("Allocate envs %v: want GPUSHARE_OVERSUB=1 and GPUSHARE_GPU_UUID=%s", resp.Envs, uuid)
	}
	// The pod's socket is GPUSHARE_SOCKET inside the mounted directory: resolve it on the host.
	var hostSock string
	for _, m := range resp.Mounts {
		if rel, err := filepath.Rel(m.ContainerPath, resp.Envs["GPUSHARE_SOCKET"]); err == nil && filepath.IsLocal(rel) {
			hostSock = filepath.Join(m.HostPath, rel)
		}
	}
	if want := hostpath.SchedulerSocket(filepath.Join(n.dir, "s"), uuid); hostSock != want {
		t.Fatalf("a pod's GPUSHARE_SOCKET is %s on the host, want the agent's layout %s", hostSock, want)
	}

	first := shimclient.Dial(t, hostSock, uuid)
	first.Send(scheduler.Message{Type: scheduler.MsgAcquire})
	first.Expect(scheduler.MsgGrant)
	second := shimclient.Dial(t, hostSock, uuid)
	n.waitFor(t, "both clients in status, the first holding", shimClients(uuid, 3*time.Second, 2, 1))
	second.Conn.Close()
	n.waitFor(t, "the second client gone from status", shimClients(uuid, 3*time.Second, 1, 1))

	n.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Index: 0, Sharing: oversubscribedTimeSlicing(2, 5*time.Second, "8Gi")})
	n.waitFor(t, "the new quantum in status, the client still holding", shimClients(uuid, 5*time.Second, 1, 1))

	n.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Index: 0, Sharing: timeSlicing(2)})
	n.waitFor(t, "no applied.shim once the GPU left oversubscription", func(g *v1alpha1.GPUNode) (bool, string) {
		st := gpuState(g, uuid)
		return st.Applied.Shim == nil, fmt.Sprintf("applied.shim %+v", st.Applied.Shim)
	})
	if _, err := os.Lstat(hostSock); !os.IsNotExist(err) {
		t.Errorf("socket %s after the GPU left oversubscription: %v, want it removed", hostSock, err)
	}
	n.waitDevices(t, "plain time-slice replicas again", "gpusharing.io/gpu-timeslice", replicas(uuid, 2, nil))
	n.waitDevices(t, "no shim shares left", "gpusharing.io/gpu-shared", nil)
}
