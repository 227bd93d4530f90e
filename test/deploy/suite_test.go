// Package deploy tests what `kubectl apply -k config/default` installs: that the API server accepts it,
// that each component's RBAC grants exactly the reviewed rules, and that the controller and the agent
// converge a policy holding nothing but their own service accounts' permissions.
package deploy

import (
	"testing"

	"github.com/gpusharing/gpusharing/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, &env) }
