package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

// agentDaemonSet reads the DaemonSet from config/agent/agent.yaml (the first document).
func agentDaemonSet(t *testing.T) *appsv1.DaemonSet {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "config", "agent", "agent.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ds := &appsv1.DaemonSet{}
	if err := yaml.UnmarshalStrict([]byte(strings.Split(string(data), "\n---\n")[0]), ds); err != nil {
		t.Fatal(err)
	}
	return ds
}

// The DaemonSet's flags are the ones main reads, and every host path the agent uses lies in a hostPath
// volume mounted at the same path: the device plugin hands those paths to the kubelet as host paths.
func TestDaemonSetFlagsParseAndEveryHostPathIsMountedAtItsHostPath(t *testing.T) {
	ds := agentDaemonSet(t)
	c := ds.Spec.Template.Spec.Containers[0]
	t.Setenv("NODE_NAME", "node-a")
	o, _ := parse(c.Args) // an unknown flag exits the test binary: that fails too
	if o.devicePlugin == nil || o.podResourcesSocket == "" {
		t.Fatalf("the DaemonSet runs the agent without the device plugin or the drain: %+v", o)
	}
	hostPathOf := map[string]string{}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.HostPath != nil {
			hostPathOf[v.Name] = v.HostPath.Path
		}
	}
	mounted := func(path string) (string, bool) {
		for _, m := range c.VolumeMounts {
			if path == m.MountPath || strings.HasPrefix(path, m.MountPath+"/") {
				return m.Name, hostPathOf[m.Name] == m.MountPath
			}
		}
		return "", false
	}
	for what, path := range map[string]string{
		"--device-plugin-dir":    o.devicePlugin.SocketDir,
		"--pod-resources-socket": o.podResourcesSocket,
		"--mps-root":             o.mpsRoot,
		"--state-dir":            o.stateDir,
		"--scheduler-root":       o.schedulerRoot,
		"--shim-library":         o.devicePlugin.ShimLibrary,
	} {
		if vol, same := mounted(path); vol == "" || !same {
			t.Errorf("%s %s: in volume %q, mounted at its host path: %v; want a hostPath volume mounted at the same path", what, path, vol, same)
		}
	}
}
