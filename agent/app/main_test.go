package app

import (
	"fmt"
	"os"
	"testing"

	"github.com/gpusharing/gpusharing/test/testenv"
)

// env is the real kube-apiserver and etcd the package's tests share.
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
