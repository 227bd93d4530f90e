package main

import (
	"testing"
	"time"
)

func TestParseDerivesHostPathsFromTheHostRoot(t *testing.T) {
	tests := []struct {
		name             string
		args             []string
		env              string
		node, mps, state string
		resync           time.Duration
		exclusiveProcess bool
	}{
		{"defaults", nil, "node-a", "node-a", "/run/gpusharing/mps", "/run/gpusharing/state", 30 * time.Second, false},
		{"host root moves every host path", []string{"--host-root=/var/lib/gs"}, "node-a", "node-a", "/var/lib/gs/mps", "/var/lib/gs/state", 30 * time.Second, false},
		{"explicit paths win", []string{"--host-root=/x", "--mps-root=/m", "--state-dir=/s", "--node-name=node-b", "--resync=5s", "--mps-exclusive-process"},
			"node-a", "node-b", "/m", "/s", 5 * time.Second, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("NODE_NAME", tt.env)
			o, _ := parse(tt.args)
			if o.nodeName != tt.node || o.mpsRoot != tt.mps || o.stateDir != tt.state || o.resync != tt.resync || o.mpsExclusiveProcess != tt.exclusiveProcess {
				t.Errorf("options = %+v", o)
			}
			if o.nvidiaSMI == "" || o.mpsControl == "" {
				t.Errorf("driver tools not resolved: %+v", o)
			}
		})
	}
}

func TestDriverToolLooksUnderTheDriverRootFirst(t *testing.T) {
	root := t.TempDir()
	if got := driverTool(root, "no-such-tool-xyz"); got != root+"/usr/bin/no-such-tool-xyz" {
		t.Errorf("missing tool resolves to %q, want the conventional path under the driver root", got)
	}
	t.Setenv("PATH", "/bin:/usr/bin")
	if got := driverTool(root, "sh"); got != "/bin/sh" && got != "/usr/bin/sh" {
		t.Errorf("tool in $PATH resolves to %q", got)
	}
}
