package chart

import (
	"fmt"
	"reflect"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// agentHostPaths are the host paths the agent opens, per device interface: its own directory (MPS
// pipes, logs and /dev/shm tmpfs under mps/, scheduler sockets, state), the shim library it installs,
// the CDI specs it writes (DRA's claims and the device plugin's devices both carry device nodes), and
// the kubelet's sockets of the interface it serves.
var agentHostPaths = map[string][]string{
	"DRA": {"/run/gpusharing", "/run/gpusharing/mps", "/usr/lib/gpusharing", "/var/run/cdi",
		"/var/lib/kubelet/plugins/gpu.gpusharing.io", "/var/lib/kubelet/plugins_registry"},
	"DevicePlugin": {"/run/gpusharing", "/run/gpusharing/mps", "/usr/lib/gpusharing", "/var/run/cdi",
		"/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources"},
	"Both": {"/run/gpusharing", "/run/gpusharing/mps", "/usr/lib/gpusharing", "/var/run/cdi",
		"/var/lib/kubelet/plugins/gpu.gpusharing.io", "/var/lib/kubelet/plugins_registry",
		"/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources"},
}

// The agent pod takes only what it uses, in kustomize's installs and each of the chart's device
// interfaces: no host IPC namespace (MPS clients share files, not System V IPC), the runtime's default
// seccomp profile for the pod, an init container with no capability and no escalation, exactly the
// host paths of the interface it serves, each mounted at its own path (the paths the agent hands the
// kubelet are host paths), and Bidirectional propagation on the MPS directory alone (its /dev/shm
// tmpfs mounts must reach the host for client pods).
func TestAgentPodTakesOnlyWhatItUses(t *testing.T) {
	for _, tc := range []struct {
		name, mode string
		objs       map[string]*unstructured.Unstructured
	}{
		{"config/default", "DRA", renderKustomize(t)},
		{"config/deviceplugin", "Both", renderKustomize(t, "deviceplugin")},
		{"chart DRA", "DRA", renderChart(t, "agent.deviceInterface=DRA")},
		{"chart Both", "Both", renderChart(t, "agent.deviceInterface=Both")},
		{"chart DevicePlugin", "DevicePlugin", renderChart(t, "agent.deviceInterface=DevicePlugin")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ds := tc.objs["DaemonSet/"+namespace+"/gpusharing-agent"]
			if ds == nil {
				t.Fatal("no agent DaemonSet")
			}
			spec, _, _ := unstructured.NestedMap(ds.Object, "spec", "template", "spec")
			if v, ok := spec["hostIPC"]; ok && v != false {
				t.Errorf("hostIPC: %v", v)
			}
			if spec["hostPID"] != true {
				t.Errorf("hostPID: %v, want true (NVML's process ids name pods through the host's /proc)", spec["hostPID"])
			}
			if p, _, _ := unstructured.NestedString(spec, "securityContext", "seccompProfile", "type"); p != "RuntimeDefault" {
				t.Errorf("pod seccomp profile %q, want RuntimeDefault", p)
			}
			init := spec["initContainers"].([]any)[0].(map[string]any)
			sc, _ := init["securityContext"].(map[string]any)
			if sc["allowPrivilegeEscalation"] != false || sc["privileged"] == true || fmt.Sprint(sc["capabilities"]) != "map[drop:[ALL]]" {
				t.Errorf("init container security context %v, want no escalation and every capability dropped", sc)
			}
			hostPaths := map[string]string{}
			var paths []string
			for _, v := range spec["volumes"].([]any) {
				v := v.(map[string]any)
				if hp, ok := v["hostPath"].(map[string]any); ok {
					hostPaths[v["name"].(string)] = hp["path"].(string)
					paths = append(paths, hp["path"].(string))
				}
			}
			slices.Sort(paths)
			want := slices.Sorted(slices.Values(agentHostPaths[tc.mode]))
			if !reflect.DeepEqual(paths, want) {
				t.Errorf("host paths\n got %v\nwant %v", paths, want)
			}
			agent := spec["containers"].([]any)[0].(map[string]any)
			for _, m := range agent["volumeMounts"].([]any) {
				m := m.(map[string]any)
				name, mp := m["name"].(string), m["mountPath"].(string)
				if hp, ok := hostPaths[name]; ok && hp != mp {
					t.Errorf("host path %s mounted at %s", hp, mp)
				}
				prop, _ := m["mountPropagation"].(string)
				if (prop == "Bidirectional") != (mp == "/run/gpusharing/mps") {
					t.Errorf("%s has propagation %q; only the MPS directory is Bidirectional", mp, prop)
				}
			}
		})
	}
}
