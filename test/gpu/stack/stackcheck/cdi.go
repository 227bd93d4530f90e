package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// The container runtime's part of DRA: the kubelet hands it the CDI device IDs NodePrepareResources
// returned, and it applies the containerEdits of the spec files in its CDI directory that define them
// (github.com/cncf-tags/container-device-interface). Read here as a runtime reads them, so the workload
// gets what a pod's container would, and nothing the plugin did not write.

// cdiSpecFile is a CDI spec as runtimes read it. Edits this harness cannot apply (hooks, ...) are kept
// raw so that a spec holding them is refused rather than applied in part.
type cdiSpecFile struct {
	Version        string            `json:"cdiVersion"`
	Kind           string            `json:"kind"`
	Devices        []cdiSpecDevice   `json:"devices"`
	ContainerEdits *cdiContainerEdit `json:"containerEdits,omitempty"`
}

type cdiSpecDevice struct {
	Name           string           `json:"name"`
	ContainerEdits cdiContainerEdit `json:"containerEdits"`
}

type cdiContainerEdit struct {
	Env    []string `json:"env,omitempty"`
	Mounts []struct {
		HostPath      string   `json:"hostPath"`
		ContainerPath string   `json:"containerPath"`
		Options       []string `json:"options,omitempty"`
	} `json:"mounts,omitempty"`
	DeviceNodes    []cdiDeviceNode `json:"deviceNodes,omitempty"`
	Hooks          json.RawMessage `json:"hooks,omitempty"`
	IntelRdt       json.RawMessage `json:"intelRdt,omitempty"`
	AdditionalGIDs json.RawMessage `json:"additionalGids,omitempty"`
	NetDevices     json.RawMessage `json:"netDevices,omitempty"`
}

// cdiDeviceNode is a device node a runtime creates in the container: path there, hostPath (path where
// unset) on the host.
type cdiDeviceNode struct {
	Path     string `json:"path"`
	HostPath string `json:"hostPath,omitempty"`
}

// cdiResolved is what a set of CDI device IDs gives a container, and the spec files that defined them.
type cdiResolved struct {
	edits edits
	files []string
}

// resolveCDI reads the specs in dir as a runtime does (files ending in .json; others, such as a spec
// being written, are skipped) and returns the edits of the devices ids names, in order: each device's
// spec-wide edits, then its own. A variable set twice keeps its last value, as in a container's
// environment. An ID defined nowhere, or twice, is an error.
func resolveCDI(dir string, ids []string) (cdiResolved, error) {
	var out cdiResolved
	entries, err := os.ReadDir(dir)
	if err != nil {
		return out, err
	}
	type found struct {
		spec *cdiSpecFile
		dev  *cdiSpecDevice
		file string
	}
	byID := map[string][]found{}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		data, err := os.ReadFile(path)
		if err != nil {
			return out, err
		}
		spec := &cdiSpecFile{}
		if err := json.Unmarshal(data, spec); err != nil {
			return out, fmt.Errorf("CDI spec %s: %w", path, err)
		}
		for i := range spec.Devices {
			id := spec.Kind + "=" + spec.Devices[i].Name
			byID[id] = append(byID[id], found{spec: spec, dev: &spec.Devices[i], file: path})
		}
	}
	out.edits.env = map[string]string{}
	files := map[string]bool{}
	for _, id := range ids {
		defs := byID[id]
		switch {
		case len(defs) == 0:
			return out, fmt.Errorf("CDI device %s: defined by no spec in %s", id, dir)
		case len(defs) > 1:
			return out, fmt.Errorf("CDI device %s: defined by %d specs in %s", id, len(defs), dir)
		}
		d := defs[0]
		files[d.file] = true
		if d.spec.ContainerEdits != nil {
			if err := addEdits(&out.edits, *d.spec.ContainerEdits); err != nil {
				return out, fmt.Errorf("CDI spec %s: %w", d.file, err)
			}
		}
		if err := addEdits(&out.edits, d.dev.ContainerEdits); err != nil {
			return out, fmt.Errorf("CDI device %s: %w", id, err)
		}
	}
	for f := range files {
		out.files = append(out.files, f)
	}
	sort.Strings(out.files)
	return out, nil
}

func addEdits(into *edits, e cdiContainerEdit) error {
	for name, raw := range map[string]json.RawMessage{"hooks": e.Hooks, "intelRdt": e.IntelRdt,
		"additionalGids": e.AdditionalGIDs, "netDevices": e.NetDevices} {
		if len(raw) > 0 && string(raw) != "null" && string(raw) != "[]" {
			return fmt.Errorf("edits of kind %s are not applied here", name)
		}
	}
	// The workload runs on the host, where it sees every device node, so the nodes cannot be given or
	// withheld here (make e2e checks that under the NVIDIA container runtime); each is checked to be a
	// character device on the host, as a runtime needs it to be, and listed.
	for _, n := range e.DeviceNodes {
		host := n.HostPath
		if host == "" {
			host = n.Path
		}
		if !filepath.IsAbs(n.Path) || !filepath.IsAbs(host) {
			return fmt.Errorf("device node %q -> %q: paths must be absolute", host, n.Path)
		}
		fi, err := os.Stat(host)
		if err != nil {
			return fmt.Errorf("device node %s: %w", host, err)
		}
		if fi.Mode()&os.ModeCharDevice == 0 {
			return fmt.Errorf("device node %s: not a character device", host)
		}
		into.deviceNodes = append(into.deviceNodes, n.Path)
	}
	for _, kv := range e.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("env entry %q is not NAME=value", kv)
		}
		into.env[k] = v
	}
	for _, m := range e.Mounts {
		if !filepath.IsAbs(m.HostPath) || !filepath.IsAbs(m.ContainerPath) {
			return fmt.Errorf("mount %q -> %q: paths must be absolute", m.HostPath, m.ContainerPath)
		}
		b := bindMount{host: m.HostPath, container: m.ContainerPath, options: m.Options}
		if _, err := mountScript(b); err != nil {
			return err
		}
		into.mounts = append(into.mounts, b)
	}
	return nil
}
