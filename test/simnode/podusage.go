package simnode

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
)

// Simulated containers. No container runs on a simulated node; where the node simulates its pods' use
// (Node.PodUsage), the stand-in kubelet gives each container of a pod it runs that declares what it would
// use (nvmlmock.EnvSimulatedMemoryMiB) a process entry under the node's proc root: the environment a
// runtime would give the container (its env and its claims' CDI edits, which name its GPU) and the cgroup
// a kubelet would put it in. The mock GPUs list the process as NVML would (nvmlmock.WatchHostProcesses),
// and the agent's accounting names its pod from the cgroup, as on a real node.

// simulatedPIDBase keeps the simulated pids clear of the machine's (the proc root is the node's own).
const simulatedPIDBase = 4_000_000

// containers are the simulated processes of the pods a Kubelet runs, by pod.
type containers struct {
	next  int
	byPod map[types.UID][]int
}

// containerID is the runtime id of a pod's container here: stable, 64 hex digits as containerd's.
func containerID(pod types.UID, container string) string {
	return fmt.Sprintf("%x", sha256.Sum256([]byte(string(pod)+"/"+container)))
}

// startContainers writes the process entries of pod's containers that declare simulated use, with the
// env of the CDI devices cdiIDs (from the agent's CDI directory) on top of each container's own.
func (k *Kubelet) startContainers(pod *corev1.Pod, cdiIDs []string) error {
	if k.ProcRoot == "" {
		return nil
	}
	if _, started := k.procs.byPod[pod.UID]; started {
		return nil
	}
	devEnv, err := cdiEnv(k.CDIDir, cdiIDs)
	if err != nil {
		return err
	}
	if k.procs.byPod == nil {
		k.procs.byPod = map[types.UID][]int{}
	}
	var pids []int
	for _, c := range pod.Spec.Containers {
		env := map[string]string{}
		for _, e := range c.Env {
			env[e.Name] = e.Value
		}
		if _, simulated := env[nvmlmock.EnvSimulatedMemoryMiB]; !simulated {
			continue
		}
		for k, v := range devEnv {
			env[k] = v
		}
		k.procs.next++
		pid := simulatedPIDBase + k.procs.next
		dir := filepath.Join(k.ProcRoot, fmt.Sprint(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		var environ []byte
		for name, v := range env {
			environ = append(append(environ, name+"="+v...), 0)
		}
		cgroup := fmt.Sprintf("0::/kubepods/besteffort/pod%s/%s\n", pod.UID, containerID(pod.UID, c.Name))
		if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cgroup), 0o644); err != nil {
			return err
		}
		// The environment last: the mock GPUs list a process once its environ declares it.
		if err := os.WriteFile(filepath.Join(dir, "environ"), environ, 0o644); err != nil {
			return err
		}
		pids = append(pids, pid)
	}
	k.procs.byPod[pod.UID] = pids
	return nil
}

// stopContainers removes the process entries of the pods not in running: the processes end with their pods.
func (k *Kubelet) stopContainers(running map[types.UID]bool) {
	for uid, pids := range k.procs.byPod {
		if running[uid] {
			continue
		}
		for _, pid := range pids {
			_ = os.RemoveAll(filepath.Join(k.ProcRoot, fmt.Sprint(pid)))
		}
		delete(k.procs.byPod, uid)
	}
}

// cdiEnv is the environment the CDI devices ids add to a container, read from the specs in dir as a
// runtime reads them: the spec's own edits and the device's.
func cdiEnv(dir string, ids []string) (map[string]string, error) {
	out := map[string]string{}
	if len(ids) == 0 {
		return out, nil
	}
	type edits struct {
		Env []string `json:"env"`
	}
	type spec struct {
		Kind           string `json:"kind"`
		ContainerEdits edits  `json:"containerEdits"`
		Devices        []struct {
			Name           string `json:"name"`
			ContainerEdits edits  `json:"containerEdits"`
		} `json:"devices"`
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	add := func(env []string) {
		for _, kv := range env {
			if k, v, ok := strings.Cut(kv, "="); ok {
				out[k] = v
			}
		}
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		var s spec
		if err := json.Unmarshal(data, &s); err != nil {
			return nil, fmt.Errorf("CDI spec %s: %w", e.Name(), err)
		}
		for _, d := range s.Devices {
			if want[s.Kind+"="+d.Name] {
				add(s.ContainerEdits.Env)
				add(d.ContainerEdits.Env)
				delete(want, s.Kind+"="+d.Name)
			}
		}
	}
	if len(want) > 0 {
		return nil, fmt.Errorf("CDI devices %v: defined by no spec in %s", want, dir)
	}
	return out, nil
}
