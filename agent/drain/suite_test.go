package drain

import (
	"fmt"
	"os"
	"testing"

	"github.com/gpusharing/gpusharing/test/testenv"
)

// env is one real API server for the package's tests.
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
		fmt.Fprintln(os.Stderr, "stopping the API server:", err)
	}
	os.Exit(code)
}
