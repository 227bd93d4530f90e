package vacate

import (
	"testing"

	"github.com/gpusharing/gpusharing/test/testenv"
)

// env is one real API server for the package's tests.
var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, &env) }
