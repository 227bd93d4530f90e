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

// ApplyDeviceClasses creates the DeviceClasses config/default installs (config/dra): the
// real kube-scheduler needs the class a claim names.
func (e *Env) ApplyDeviceClasses(ctx context.Context) error {
	const file = "config/dra/deviceclasses.yaml"
	data, err := os.ReadFile(filepath.Join(e.RepoRoot, file))
	if err != nil {
		return err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var dc resourcev1.DeviceClass
		if err := dec.Decode(&dc); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		if dc.Name == "" {
			continue
		}
		if err := e.Client.Create(ctx, &dc); err != nil {
			return fmt.Errorf("DeviceClass %s: %w", dc.Name, err)
		}
	}
}
