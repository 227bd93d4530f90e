package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	resourcev1 "k8s.io/api/resource/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// DeviceClassFiles are config/dra's DeviceClasses: one per kind of share, one per MIG profile.
var DeviceClassFiles = []string{"config/dra/deviceclasses.yaml", "config/dra/deviceclasses-mig.yaml"}

// ApplyDeviceClasses creates the DeviceClasses config/default installs (config/dra): the
// real kube-scheduler needs the class a claim names.
func (e *Env) ApplyDeviceClasses(ctx context.Context) error {
	classes, err := e.DeviceClasses()
	if err != nil {
		return err
	}
	for i := range classes {
		if err := e.Client.Create(ctx, &classes[i]); err != nil {
			return fmt.Errorf("DeviceClass %s: %w", classes[i].Name, err)
		}
	}
	return nil
}

// DeviceClasses reads config/dra's DeviceClasses.
func (e *Env) DeviceClasses() ([]resourcev1.DeviceClass, error) {
	var out []resourcev1.DeviceClass
	for _, file := range DeviceClassFiles {
		data, err := os.ReadFile(filepath.Join(e.RepoRoot, file))
		if err != nil {
			return nil, err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			var dc resourcev1.DeviceClass
			if err := dec.Decode(&dc); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return nil, fmt.Errorf("%s: %w", file, err)
			}
			if dc.Name != "" {
				out = append(out, dc)
			}
		}
	}
	return out, nil
}
