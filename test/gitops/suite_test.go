// Package gitops tests what GitOps tools read from gpusharing's objects: the Argo CD health checks in
// config/argocd (run in gopher-lua as Argo CD runs them) and kstatus, which Flux uses, on objects the
// real API server stores.
package gitops

import (
	"testing"

	"github.com/gpusharing/gpusharing/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, &env) }
