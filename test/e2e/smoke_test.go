//go:build e2e

package e2e

import "testing"

func TestSmoke(t *testing.T) {
	t.Log(node.Kubeconfig)
}
