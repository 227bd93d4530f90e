package mps

import (
	"fmt"
	"os"
	"testing"
)

// TestMain lets the test binary be the agent's launcher: the manager under test runs
// <test binary> mps-launch <shm-dir> <fake control> -d, exactly as the agent runs itself. It is also the
// tenant probe (probe_test.go): <test binary> mps-tenant-probe <rootfs> <host>:<container>...
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == LaunchCommand {
		err := Launch(os.Args[2:], os.Environ())
		fmt.Fprintf(os.Stderr, "%s: %v\n", LaunchCommand, err)
		os.Exit(1)
	}
	if len(os.Args) > 1 && os.Args[1] == probeCommand {
		if err := tenantProbe(os.Args[2], os.Args[3:]); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", probeCommand, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
