package dra

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpusharing/gpusharing/agent/share"
)

// CDI (the Container Device Interface, tags.cncf.io/container-device-interface) is how a DRA driver
// hands the container runtime what a container needs: the kubelet passes the CDI device IDs
// NodePrepareResources returns to containerd or CRI-O, which apply the edits of the spec file that
// defines them. The spec types, their validation and the file writes are the CDI project's own packages,
// the ones the runtimes read the files with.
const (
	// CDIVendor and CDIClass make the kind of every device the plugin defines: gpusharing.io/claim.
	CDIVendor = "gpusharing.io"
	CDIClass  = "claim"
	// CDIKind is the kind of every CDI device the plugin writes; an ID is <CDIKind>=<name>.
	CDIKind = CDIVendor + "/" + CDIClass
	// DefaultCDIDir is where container runtimes look for CDI specs written at run time.
	DefaultCDIDir = cdiapi.DefaultDynamicDir
)

// cdiSpecs writes and removes the claims' spec files in one directory. The CDI cache validates a spec
// before it writes it (version, kind, device names, edits) and writes through a temporary file and a
// rename, so a runtime reads the old file or the new one, never a torn one. It never refreshes on its
// own: the plugin only writes, and a directory watch would be a goroutine and an inotify instance for
// nothing.
type cdiSpecs struct {
	dir   string
	cache *cdiapi.Cache
}

func newCDISpecs(dir string) (*cdiSpecs, error) {
	// NewCache reads the directory once (its error is always nil; what it could not read is kept in
	// the cache's errors, which writing and removing do not consult).
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("opening the CDI directory %s: %w", dir, err)
	}
	return &cdiSpecs{dir: dir, cache: cache}, nil
}

// cdiSpecName is the file name of a claim's spec: CDI's transient spec name for the claim's uid, so one
// claim's file is never another's. Derived from the uid alone, so a claim the checkpoint lost can still
// be cleaned up.
func cdiSpecName(claim types.UID) string {
	return cdiapi.GenerateTransientSpecName(CDIVendor, CDIClass, string(claim)) + ".json"
}

// CDISpecPath is the spec file of a claim in dir: <dir>/gpusharing.io-claim_<uid>.json.
func CDISpecPath(dir string, claim types.UID) string {
	return filepath.Join(dir, cdiSpecName(claim))
}

// write validates spec and writes it as the claim's file.
func (s *cdiSpecs) write(claim types.UID, spec *cdispec.Spec) error {
	return s.cache.WriteSpec(spec, cdiSpecName(claim))
}

// valid says whether the claim's file is there and reads back as a valid spec.
func (s *cdiSpecs) valid(claim types.UID) bool {
	_, err := cdiapi.ReadSpec(CDISpecPath(s.dir, claim), 0)
	return err == nil
}

// remove deletes the claim's file; a file already gone is no error.
func (s *cdiSpecs) remove(claim types.UID) error {
	return s.cache.RemoveSpec(cdiSpecName(claim))
}

// newCDISpec is a spec of the plugin's kind holding devices, at the lowest CDI version that has
// everything it uses: the older a version, the more runtimes read it.
func newCDISpec(devices []cdispec.Device) (cdispec.Spec, error) {
	spec := cdispec.Spec{Kind: CDIKind, Devices: devices}
	v, err := cdispec.MinimumRequiredVersion(&spec)
	if err != nil {
		return spec, fmt.Errorf("the CDI version the spec needs: %w", err)
	}
	spec.Version = v
	return spec, nil
}

// cdiEditsOf turns the device plugin's answer for one container into CDI edits: the same device nodes,
// the same variables and the same bind mounts, read-only where Allocate says so. Variables are sorted so
// a spec is stable.
func cdiEditsOf(resp *pluginapi.ContainerAllocateResponse) cdispec.ContainerEdits {
	var e cdispec.ContainerEdits
	e.DeviceNodes = share.CDIDeviceNodes(resp.Devices)
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
		e.Mounts = append(e.Mounts, &cdispec.Mount{HostPath: m.HostPath, ContainerPath: m.ContainerPath,
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
func CDIID(name string) string { return parser.QualifiedName(CDIVendor, CDIClass, name) }
