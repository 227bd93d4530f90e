package app

import (
	"fmt"
	"os"
	"testing"

	"github.com/gpusharing/gpusharing/agent/mps"
	"github.com/gpusharing/gpusharing/test/testenv"
)

// env is the real kube-apiserver and etcd the package's tests share.
var env *testenv.Env

// TestMain serves the test binary's mps-launch subcommand (the harness's agent starts MPS daemons
// through it, as the agent starts them through itself) before starting the API server.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == mps.LaunchCommand {
		err := mps.Launch(os.Args[2:], os.Environ())
		fmt.Fprintf(os.Stderr, "%s: %v\n", mps.LaunchCommand, err)
		os.Exit(1)
	}
	testenv.Main(m, &env)
}
