package nvmlmock

import "fmt"

// recordedModels names the models simulated from a recording of test/gpu/mig/record.py (recordings/).
var recordedModels = map[string]string{"H200": "nvidia-h200.json"}

// NewNode is one simulated GPU node's server, as the demo, the deployment tests and the real-node e2e
// run it: model "H100" (the real H100 80GB HBM3's MIG geometry), "A100" (the documented A100-SXM4-40GB)
// or a model recorded by test/gpu/mig/record.py ("H200", recordings/nvidia-h200.json),
// gpus of the server's eight, NVML events from an injectable queue so the health watcher runs as on a real
// node, and GPU UUIDs made unique across a simulated fleet by seq (the mocks number every server alike).
func NewNode(model string, gpus, seq int) (*Server, error) {
	if gpus < 1 || gpus > 8 {
		return nil, fmt.Errorf("a simulated DGX has 1 to 8 GPUs, not %d", gpus)
	}
	var server *Server
	switch model {
	case "H100":
		server = NewH100(gpus)
	case "A100":
		server = NewA100(gpus)
	default:
		file, ok := recordedModels[model]
		if !ok {
			return nil, fmt.Errorf("simulated GPU model %q: want H100, A100 or a recorded model (%v)", model, Recorded())
		}
		rec, err := LoadRecording(file)
		if err != nil {
			return nil, fmt.Errorf("simulated GPU model %q: %w (record it with test/gpu/mig/record.py)", model, err)
		}
		inv := rec.Inventory()
		server = NewFromInventory(inv, inv.Devices[0], gpus)
	}
	NewEvents(server)
	for i, g := range server.GPUs {
		g.Device.UUID = fmt.Sprintf("GPU-%08x-%04x-4000-8000-000000000000", seq, i)
	}
	return server, nil
}
