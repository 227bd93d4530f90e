package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// specA is a spec as the agent's kubelet plugin writes one (agent/dra/cdi.go), with a spec-wide edit
// added; specB defines a device of another claim.
const (
	specA = `{"cdiVersion": "0.6.0", "kind": "gpusharing.io/claim",
  "containerEdits": {"env": ["FROM_SPEC=1", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100"]},
  "devices": [{"name": "uid-a-gpu", "containerEdits": {
    "env": ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M", "LD_PRELOAD=/usr/lib/gpusharing/libgpushare.so"],
    "mounts": [
      {"hostPath": "/h/mps/GPU-1/pipe", "containerPath": "/var/run/gpusharing/mps", "options": ["rw", "nosuid", "nodev", "rbind"]},
      {"hostPath": "/h/lib/libgpushare.so", "containerPath": "/usr/lib/gpusharing/libgpushare.so", "options": ["ro", "nosuid", "nodev", "rbind"]}]}}]}`
	specB = `{"cdiVersion": "0.6.0", "kind": "gpusharing.io/claim",
  "devices": [{"name": "uid-b-gpu", "containerEdits": {"env": ["GPUSHARE_MEMORY_LIMIT_BYTES=17179869184"]}}]}`
)

func writeSpecs(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// A CDI device ID resolves to its spec's edits, then the device's own, as a runtime applies them: the
// device's variable wins over the spec's, mounts keep their options, and only the spec that defines the
// device is named. A file not ending in .json (a spec being written) is not read.
func TestResolveCDIAppliesTheSpecsEditsThenTheDevices(t *testing.T) {
	dir := writeSpecs(t, map[string]string{"gpusharing.io-claim_a.json": specA, "gpusharing.io-claim_b.json": specB,
		".gpusharing.io-claim_c.json.tmp-1": `not json`})
	got, err := resolveCDI(dir, []string{"gpusharing.io/claim=uid-a-gpu"})
	if err != nil {
		t.Fatal(err)
	}
	wantEnv := map[string]string{"FROM_SPEC": "1", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M",
		"LD_PRELOAD": "/usr/lib/gpusharing/libgpushare.so"}
	if !reflect.DeepEqual(got.edits.env, wantEnv) {
		t.Errorf("env %v, want %v", got.edits.env, wantEnv)
	}
	wantMounts := []bindMount{
		{host: "/h/mps/GPU-1/pipe", container: "/var/run/gpusharing/mps", options: []string{"rw", "nosuid", "nodev", "rbind"}},
		{host: "/h/lib/libgpushare.so", container: "/usr/lib/gpusharing/libgpushare.so", options: []string{"ro", "nosuid", "nodev", "rbind"}},
	}
	if !reflect.DeepEqual(got.edits.mounts, wantMounts) {
		t.Errorf("mounts %+v, want %+v", got.edits.mounts, wantMounts)
	}
	if want := []string{filepath.Join(dir, "gpusharing.io-claim_a.json")}; !reflect.DeepEqual(got.files, want) {
		t.Errorf("files %v, want %v", got.files, want)
	}
}

// What a runtime would refuse, or this harness could not apply exactly, is an error rather than a
// container started with part of its edits.
func TestResolveCDIRefusesWhatItCannotApply(t *testing.T) {
	for _, tt := range []struct {
		name  string
		files map[string]string
		id    string
		want  string
	}{
		{"an ID no spec defines", map[string]string{"a.json": specA}, "gpusharing.io/claim=uid-x-gpu", "defined by no spec"},
		{"an ID of another kind", map[string]string{"a.json": specA}, "nvidia.com/gpu=uid-a-gpu", "defined by no spec"},
		{"an ID two specs define", map[string]string{"a.json": specA, "a2.json": specA}, "gpusharing.io/claim=uid-a-gpu", "defined by 2 specs"},
		{"a spec that is not JSON", map[string]string{"a.json": specA, "bad.json": "{"}, "gpusharing.io/claim=uid-a-gpu", "bad.json"},
		{"a device node the host lacks", map[string]string{"d.json": `{"kind": "k/c", "devices": [{"name": "d", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia-none"}]}}]}`},
			"k/c=d", "/dev/nvidia-none"},
		{"a device node that is no character device", map[string]string{"d.json": `{"kind": "k/c", "devices": [{"name": "d", "containerEdits": {"deviceNodes": [{"path": "/dev/x", "hostPath": "/etc/hostname"}]}}]}`},
			"k/c=d", "not a character device"},
		{"hooks in the spec's edits", map[string]string{"d.json": `{"kind": "k/c", "containerEdits": {"hooks": [{"hookName": "createContainer"}]}, "devices": [{"name": "d", "containerEdits": {}}]}`},
			"k/c=d", "hooks"},
		{"a variable without a value", map[string]string{"d.json": `{"kind": "k/c", "devices": [{"name": "d", "containerEdits": {"env": ["NOVALUE"]}}]}`},
			"k/c=d", "NAME=value"},
		{"a relative mount", map[string]string{"d.json": `{"kind": "k/c", "devices": [{"name": "d", "containerEdits": {"mounts": [{"hostPath": "h", "containerPath": "/c"}]}}]}`},
			"k/c=d", "absolute"},
		{"a mount option not applied here", map[string]string{"d.json": `{"kind": "k/c", "devices": [{"name": "d", "containerEdits": {"mounts": [{"hostPath": "/h", "containerPath": "/c", "options": ["shared"]}]}}]}`},
			"k/c=d", `"shared"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := resolveCDI(writeSpecs(t, tt.files), []string{tt.id})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one saying %q", err, tt.want)
			}
		})
	}
}

// A device node that exists on the host as a character device is accepted and listed (the workload
// runs on the host, where it sees every node).
func TestResolveCDIChecksDeviceNodesOnTheHost(t *testing.T) {
	spec := `{"kind": "k/c", "devices": [{"name": "d", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/null"}]}}]}`
	got, err := resolveCDI(writeSpecs(t, map[string]string{"d.json": spec}), []string{"k/c=d"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"/dev/nvidia0"}; !reflect.DeepEqual(got.edits.deviceNodes, want) {
		t.Errorf("device nodes %v, want %v", got.edits.deviceNodes, want)
	}
}

// Each mount is a bind (recursive for rbind) and, for its flags, a remount; a device plugin mount marked
// read-only is remounted ro, one not marked keeps the bind alone.
func TestMountScriptBindsThenRemountsWithTheFlags(t *testing.T) {
	for _, tt := range []struct {
		m    bindMount
		want []string
	}{
		{bindMount{host: "/h", container: "/c"}, []string{"mount --bind '/h' '/c'"}},
		{bindMount{host: "/h", container: "/c", options: []string{"rw", "rbind"}}, []string{"mount --rbind '/h' '/c'"}},
		{bindMount{host: "/h it's", container: "/c", options: []string{"ro", "nosuid", "nodev", "rbind"}},
			[]string{`mount --rbind '/h it'\''s' '/c'`, "mount -o remount,bind,ro,nosuid,nodev '/c'"}},
	} {
		got, err := mountScript(tt.m)
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("mountScript(%+v) = %q, %v; want %q", tt.m, got, err, tt.want)
		}
	}
	resp := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"A": "1"}, Mounts: []*pluginapi.Mount{
		{HostPath: "/h1", ContainerPath: "/c1", ReadOnly: true}, {HostPath: "/h2", ContainerPath: "/c2"}}}
	e := editsOfAllocate(resp)
	want := edits{env: map[string]string{"A": "1"}, mounts: []bindMount{{host: "/h1", container: "/c1", options: []string{"ro"}}, {host: "/h2", container: "/c2"}}}
	if !reflect.DeepEqual(e, want) {
		t.Errorf("editsOfAllocate = %+v, want %+v", e, want)
	}
}

// A pod that drops its claim's limits keeps its GPU and its mounts, and loses the shim and every MPS
// client setting.
func TestWithoutLimitsKeepsOnlyTheGPU(t *testing.T) {
	e := edits{env: map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-1", "NVIDIA_VISIBLE_DEVICES": "GPU-1", "LD_PRELOAD": "/usr/lib/gpusharing/libgpushare.so",
		"CUDA_MPS_PIPE_DIRECTORY": "/var/run/gpusharing/mps", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2048M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "5",
		"GPUSHARE_MEMORY_LIMIT_BYTES": "2147483648", "GPUSHARE_SOCKET": "/var/run/gpusharing/scheduler/gpushare.sock"},
		mounts: []bindMount{{host: "/h", container: "/c"}}}
	got := withoutLimits(e)
	if want := map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-1", "NVIDIA_VISIBLE_DEVICES": "GPU-1"}; !reflect.DeepEqual(got.env, want) {
		t.Errorf("env %v, want %v", got.env, want)
	}
	if !reflect.DeepEqual(got.mounts, e.mounts) {
		t.Errorf("mounts %+v, want %+v", got.mounts, e.mounts)
	}
}
