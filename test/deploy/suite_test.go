// Package deploy tests what `kubectl apply -k config/default` installs: that the API server accepts it,
// that each component's RBAC grants exactly the reviewed rules, and that the controller and the agent
// converge a policy holding nothing but their own service accounts' permissions.
package deploy

import (
	"fmt"
	"os"
	"testing"

	"github.com/gpusharing/gpusharing/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	var err error
	env, err = testenv.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(code)
}
