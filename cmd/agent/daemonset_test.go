package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
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
// volume mounted at the same path: the kubelet plugin and the device plugin hand those paths to the
// kubelet and the runtime as host paths. config/agent serves shares through DRA alone (the default
// install); the device plugin's paths are checked where config/deviceplugin adds it (test/deploy).
func TestDaemonSetFlagsParseAndEveryHostPathIsMountedAtItsHostPath(t *testing.T) {
	ds := agentDaemonSet(t)
	c := ds.Spec.Template.Spec.Containers[0]
	t.Setenv("NODE_NAME", "node-a")
	o, _ := parse(c.Args) // an unknown flag exits the test binary: that fails too
	// Without the device plugin the drain finds a GPU's pods by their claims, not the PodResources API.
	if o.draPlugin == nil || o.devicePlugin != nil {
		t.Fatalf("the DaemonSet runs the agent with DRA %v and the device plugin %v; want DRA alone", o.draPlugin != nil, o.devicePlugin != nil)
	}
	hostPathOf := map[string]string{}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.HostPath != nil {
			hostPathOf[v.Name] = v.HostPath.Path
		}
	}
	mounted := func(path string) (string, bool) {
		m, ok := mountOf(c, path)
		return m.Name, ok && hostPathOf[m.Name] == m.MountPath
	}
	for what, path := range map[string]string{
		"--dra-plugin-dir":   o.draPlugin.PluginDir,
		"--dra-registry-dir": o.draPlugin.RegistryDir,
		"--cdi-dir":          o.draPlugin.CDIDir,
		"--mps-root":         o.mpsRoot,
		"--state-dir":        o.stateDir,
		"--scheduler-root":   o.schedulerRoot,
		"--shim-library":     o.shares.ShimLibrary,
	} {
		if vol, same := mounted(path); vol == "" || !same {
			t.Errorf("%s %s: in volume %q, mounted at its host path: %v; want a hostPath volume mounted at the same path", what, path, vol, same)
		}
	}
}

// mountOf is the volume mount in effect at path: the deepest one that holds it.
func mountOf(c corev1.Container, path string) (corev1.VolumeMount, bool) {
	var best corev1.VolumeMount
	found := false
	for _, m := range c.VolumeMounts {
		if (path == m.MountPath || strings.HasPrefix(path, m.MountPath+"/")) && len(m.MountPath) >= len(best.MountPath) {
			best, found = m, true
		}
	}
	return best, found
}

// The agent mounts each MPS GPU's /dev/shm tmpfs under --mps-root; pods get it from the host, so that
// directory's mount must propagate the agent's mounts to the host (Bidirectional, which only a privileged
// container may have). No node-wide directory is mounted at the agent's /dev/shm any more: each daemon
// gets its GPU's tmpfs in a namespace of its own.
func TestTheMPSRootPropagatesTheAgentsTmpfsMountsToTheHost(t *testing.T) {
	ds := agentDaemonSet(t)
	c := ds.Spec.Template.Spec.Containers[0]
	t.Setenv("NODE_NAME", "node-a")
	o, _ := parse(c.Args)
	m, ok := mountOf(c, filepath.Join(o.mpsRoot, "GPU-x", "shm"))
	if !ok || m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationBidirectional {
		t.Errorf("the mount holding %s/<uuid>/shm is %+v; want mountPropagation Bidirectional", o.mpsRoot, m)
	}
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Error("the agent is not privileged: it can neither mount the tmpfs nor have Bidirectional propagation")
	}
	if m, ok := mountOf(c, "/dev/shm"); ok {
		t.Errorf("volume %q is mounted at the agent's /dev/shm; want none (each daemon gets its GPU's tmpfs)", m.Name)
	}
	if o.mpsShmSize < 1<<30 {
		t.Errorf("--mps-shm-size is %d bytes; want at least 1Gi, room for DataLoader workers", o.mpsShmSize)
	}
}

// The init container installs the shim through `agent install-shim` into the directory the agent's
// --shim-library lives in, so the device plugin mounts the build it just linked.
func TestInitContainerInstallsTheShimAtomicallyWhereThePluginsLook(t *testing.T) {
	ds := agentDaemonSet(t)
	if len(ds.Spec.Template.Spec.InitContainers) != 1 {
		t.Fatalf("init containers = %d, want 1", len(ds.Spec.Template.Spec.InitContainers))
	}
	init := ds.Spec.Template.Spec.InitContainers[0]
	if len(init.Command) < 2 || init.Command[0] != "/agent" || init.Command[1] != "install-shim" {
		t.Fatalf("init container runs %v; want /agent install-shim (a plain cp rewrites a library running pods have mapped)", init.Command)
	}
	src, host := t.TempDir(), t.TempDir()
	lib := filepath.Join(src, "libgpushare.so")
	if err := os.WriteFile(lib, []byte("\x7fELF build 1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if rc := runInstallShim([]string{"--from=" + lib, "--to=" + host}); rc != 0 {
		t.Fatalf("install-shim exit %d", rc)
	}
	o, _ := parse(ds.Spec.Template.Spec.Containers[0].Args)
	want := filepath.Join("/usr/lib/gpusharing", filepath.Base(o.shares.ShimLibrary))
	var to string
	for _, a := range init.Command[2:] {
		if v, ok := strings.CutPrefix(a, "--to="); ok {
			to = v
		}
	}
	if filepath.Join(to, "libgpushare.so") != o.shares.ShimLibrary || o.shares.ShimLibrary != want {
		t.Errorf("install-shim --to=%s, agent --shim-library=%s: the plugins would mount another file", to, o.shares.ShimLibrary)
	}
	if got, err := os.ReadFile(filepath.Join(host, "libgpushare.so")); err != nil || string(got) != "\x7fELF build 1" {
		t.Errorf("installed library reads %q, %v", got, err)
	}
}
