package rightsizing_test

import (
	"testing"

	"github.com/gpusharing/gpusharing/test/testenv"
)

// env is one real kube-apiserver and etcd with the CRDs installed, shared by every test of the package.
var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, &env) }
