package main

import (
	"os"
	"strings"
	"testing"

	"github.com/gpusharing/gpusharing/internal/flagref"
)

const flagReference = "../../docs/reference/manager-flags.md"

// reference is the manager's flag reference over its real flag set, with a planted flag if asked.
func reference(planted bool) flagref.Reference {
	var f managerFlags
	fs, _ := flagSet(&f)
	if planted {
		fs.String("planted-flag", "", "a flag the committed reference does not list")
	}
	return flagref.Reference{
		Binary: "manager",
		Source: "cmd/manager",
		Intro: "The controller manager (a Deployment): it resolves GPUSharingPolicies into each GPUNode's spec, " +
			"rolls disruptive changes out within each policy's budget and writes the policies' status " +
			"([controller.md](../controller.md)).",
		Commands: []flagref.Command{{Name: "manager", Flags: fs}},
	}
}

// TestFlagReference compares docs/reference/manager-flags.md with the manager's flag set; with
// UPDATE_REFERENCE=1 (make generate) it writes the file.
func TestFlagReference(t *testing.T) {
	if err := flagref.Check(flagReference, reference(false), os.Getenv("UPDATE_REFERENCE") != ""); err != nil {
		t.Error(err)
	}
}

func TestFlagReferenceFailsOnAFlagWithoutAnEntry(t *testing.T) {
	err := flagref.Check(flagReference, reference(true), false)
	if err == nil || !strings.Contains(err.Error(), "flag --planted-flag has no entry") {
		t.Errorf("check with a planted flag = %v, want it to name the flag", err)
	}
}
