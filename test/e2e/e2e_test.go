//go:build e2e

package e2e

import "testing"

// TestE2E runs the scenarios in order on one node: each starts from where the one before left the
// cluster, as an operator's day goes (install, share, schedule, change, upgrade, restart, uninstall).
func TestE2E(t *testing.T) {
	for _, s := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"Install", testInstall},
		{"ExamplePods", testExamplePods},
		{"DevicePluginInstall", testDevicePluginInstall},
		{"DeviceNodes", testDeviceNodes},
		{"Sharing", testSharing},
		{"DeviceNodesShared", testDeviceNodesShared},
		{"Pods", testPods},
		{"Usage", testUsage},
		{"Rightsizing", testRightsizing},
		{"DRA", testDRA},
		{"DynamicMIG", testDynamicMIG},
		{"MultiGPU", testMultiGPU},
		{"Drain", testDrain},
		{"Upgrade", testUpgrade},
		{"KubeletRestart", testKubeletRestart},
		{"Uninstall", testUninstall},
	} {
		if !t.Run(s.name, s.run) {
			t.Fatalf("scenario %s failed: the later ones depend on it", s.name)
		}
	}
}
