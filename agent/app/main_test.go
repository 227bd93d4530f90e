package app

import (
	"testing"

	"github.com/gpusharing/gpusharing/test/testenv"
)

// env is the real kube-apiserver and etcd the package's tests share.
var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, &env) }
