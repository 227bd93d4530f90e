package nvmlmock

import "fmt"

// NewNode is one simulated GPU node's server, as the demo, the deployment tests and the real-node e2e
// run it: model "H100" (the real H100 80GB HBM3's MIG geometry) or "A100" (the documented A100-SXM4-40GB),
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
		return nil, fmt.Errorf("simulated GPU model %q: want H100 or A100", model)
	}
	NewEvents(server)
	for i, g := range server.GPUs {
		g.Device.UUID = fmt.Sprintf("GPU-%08x-%04x-4000-8000-000000000000", seq, i)
	}
	return server, nil
}
