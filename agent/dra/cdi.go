package dra

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// CDI (the Container Device Interface, github.com/cncf-tags/container-device-interface) is how a DRA
// driver hands the container runtime what a container needs: the kubelet passes the CDI device IDs
// NodePrepareResources returns to containerd or CRI-O, which apply the edits of the spec file that
// defines them. The spec is written here as plain JSON; the types below are the part of the CDI spec
// (version 0.6.0) the plugin uses.
const (
	// CDIVendor and CDIClass make the kind of every device the plugin defines: gpusharing.io/claim.
	CDIVendor = "gpusharing.io"
	CDIClass  = "claim"
	// CDIKind is the kind of every CDI device the plugin writes; an ID is <CDIKind>=<name>.
	CDIKind = CDIVendor + "/" + CDIClass
	// CDIVersion is the CDI spec version written: 0.6.0 is the first with everything used here and is
	// read by containerd 1.7+ and CRI-O 1.28+.
	CDIVersion = "0.6.0"
	// DefaultCDIDir is where container runtimes look for CDI specs written at run time.
	DefaultCDIDir = "/var/run/cdi"
)

// cdiSpec is one CDI spec file: a claim's devices, one per request.
type cdiSpec struct {
	Version string      `json:"cdiVersion"`
	Kind    string      `json:"kind"`
	Devices []cdiDevice `json:"devices"`
}

type cdiDevice struct {
	Name           string   `json:"name"`
	ContainerEdits cdiEdits `json:"containerEdits"`
}

type cdiEdits struct {
	Env    []string   `json:"env,omitempty"`
	Mounts []cdiMount `json:"mounts,omitempty"`
}

type cdiMount struct {
	HostPath      string   `json:"hostPath"`
	ContainerPath string   `json:"containerPath"`
	Options       []string `json:"options,omitempty"`
}

// cdiEditsOf turns the device plugin's answer for one container into CDI edits: the same variables and
// the same bind mounts, read-only where Allocate says so. Variables are sorted so a spec is stable.
func cdiEditsOf(resp *pluginapi.ContainerAllocateResponse) cdiEdits {
	var e cdiEdits
	keys := make([]string, 0, len(resp.Envs))
	for k := range resp.Envs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		e.Env = append(e.Env, k+"="+resp.Envs[k])
	}
	for _, m := range resp.Mounts {
		mode := "rw"
		if m.ReadOnly {
			mode = "ro"
		}
		e.Mounts = append(e.Mounts, cdiMount{HostPath: m.HostPath, ContainerPath: m.ContainerPath,
			Options: []string{mode, "nosuid", "nodev", "rbind"}})
	}
	return e
}

// cdiDeviceName is the CDI device of one request of a claim. The claim's uid makes it unique for ever:
// runtimes may cache specs, and a name is never reused for other edits. A subrequest's '/' is not
// allowed in a CDI name.
func cdiDeviceName(claim types.UID, request string) string {
	return string(claim) + "-" + strings.ReplaceAll(request, "/", "_")
}

// CDIID is the fully qualified CDI device ID the kubelet hands the runtime.
func CDIID(name string) string { return CDIKind + "=" + name }

// CDISpecPath is the spec file of a claim in dir. Derived from the uid alone, so a claim the checkpoint
// lost can still be cleaned up.
func CDISpecPath(dir string, claim types.UID) string {
	return filepath.Join(dir, fmt.Sprintf("%s-%s_%s.json", CDIVendor, CDIClass, claim))
}

// writeFileAtomic writes data to path through a temporary file in the same directory and a rename, so a
// reader (the runtime, a restarted agent) sees the old file or the new one, never a torn one. The
// temporary name does not end in .json, so runtimes scanning the CDI directory skip it.
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

func writeCDISpec(path string, spec cdiSpec) error {
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(path, data, 0o644)
}
