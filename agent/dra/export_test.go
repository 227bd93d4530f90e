package dra

import "os"

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
