package v1alpha1_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/gpusharing/gpusharing/test/testenv"
)

// env is one real kube-apiserver and etcd with the CRDs installed, shared by every test of the package.
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
		fmt.Fprintln(os.Stderr, "stopping the test API server:", err)
	}
	os.Exit(code)
}
