package dra

import (
	"context"
	"os"

	resourcev1 "k8s.io/api/resource/v1"

	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// SetCheckpointWriter makes p write its checkpoint through write, so a test can make the write fail.
func SetCheckpointWriter(p *KubeletPlugin, write func(path string, data []byte, perm os.FileMode) error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.writeFile = write
}

// WriteFileAtomic is the checkpoint's real writer.
var WriteFileAtomic = writeFileAtomic

// SetMIGLedgerWriter makes m write its ledger through write, so a test can stop the agent at a write.
func SetMIGLedgerWriter(m *DynamicMIG, write func(path string, data []byte, perm os.FileMode) error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.writeFile = write
}

// NodeDevices is what the Publisher publishes for node (PublishStatus): its status's devices less the
// placements a pending fixed-layout change withholds.
func NodeDevices(node *v1alpha1.GPUNode, cfg share.Config) []resourcev1.Device {
	return devices(node.Status, cfg, pendingLayouts(node))
}

// SyncMPSTenants runs one pass of the namespace daemons' sync, as the plugin's goroutine does on a
// request.
func SyncMPSTenants(ctx context.Context, p *KubeletPlugin) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.syncMPSTenants(ctx)
}
