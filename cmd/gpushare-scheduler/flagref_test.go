package main

import (
	"os"
	"strings"
	"testing"

	"github.com/gpusharing/gpusharing/internal/flagref"
)

const flagReference = "../../docs/reference/gpushare-scheduler-flags.md"

// reference is the scheduler's flag reference over its real flag set, with a planted flag if asked.
func reference(planted bool) flagref.Reference {
	fs, _ := flagSet()
	if planted {
		fs.String("planted-flag", "", "a flag the committed reference does not list")
	}
	return flagref.Reference{
		Binary: "gpushare-scheduler",
		Source: "cmd/gpushare-scheduler",
		Intro: "The shim's per-GPU lock and memory-budget scheduler run on its own, outside the node agent: for " +
			"the GPU benchmarks and for trying the shim on a machine without Kubernetes " +
			"([shim.md](../shim.md)). The agent runs the same scheduler with its own flags.",
		Commands: []flagref.Command{{Name: "gpushare-scheduler", Flags: fs}},
	}
}

// TestFlagReference compares docs/reference/gpushare-scheduler-flags.md with the scheduler's flag set;
// with UPDATE_REFERENCE=1 (make generate) it writes the file.
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
