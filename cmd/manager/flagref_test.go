package main

import (
	"os"
	"testing"

	"github.com/gpusharing/gpusharing/internal/flagref"
)

const flagReference = "../../docs/reference/manager-flags.md"

// reference is the manager's flag reference over its real flag set.
func reference() flagref.Reference {
	var f managerFlags
	fs, _ := flagSet(&f)
	return flagref.Reference{
		Binary: "manager",
		Source: "cmd/manager",
		Intro: "The controller manager (a Deployment): it resolves GPUSharingPolicies into each GPUNode's spec, " +
			"rolls disruptive changes out within each policy's budget and writes the policies' status " +
			"([controller.md](../controller.md)).",
		Commands: []flagref.Command{{Name: "manager", Flags: fs}},
	}
}

// TestFlagReference compares docs/reference/manager-flags.md with the manager's flag set (with
// UPDATE_REFERENCE=1, make generate, it writes the file) and sees a planted flag fail it.
func TestFlagReference(t *testing.T) {
	flagref.Test(t, flagReference, reference, os.Getenv("UPDATE_REFERENCE") != "")
}
