package flagref

import (
	"flag"
	"strings"
	"testing"
)

// PlantedFlag is the flag Test adds to a binary's first flag set to see the check fail.
const PlantedFlag = "planted-flag"

// Test is every binary's pair of reference tests: the committed file at path lists exactly the flags of
// ref's flag sets (rewritten instead where update is set: UPDATE_REFERENCE, make generate), and a flag the file
// does not list fails the check by name. ref builds the reference anew on each call, since the planted
// flag changes its first flag set.
func Test(t *testing.T, path string, ref func() Reference, update bool) {
	t.Helper()
	if err := Check(path, ref(), update); err != nil {
		t.Error(err)
	}
	planted := ref()
	plant(planted.Commands[0].Flags)
	err := Check(path, planted, false)
	if err == nil || !strings.Contains(err.Error(), "--"+PlantedFlag+" has no entry") {
		t.Errorf("check with a planted flag = %v, want it to name the flag", err)
	}
}

func plant(fs *flag.FlagSet) {
	fs.String(PlantedFlag, "", "a flag the committed reference does not list")
}
