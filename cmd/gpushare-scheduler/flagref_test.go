package main

import (
	"os"
	"testing"

	"github.com/gpusharing/gpusharing/internal/flagref"
)

const flagReference = "../../docs/reference/gpushare-scheduler-flags.md"

// reference is the scheduler's flag reference over its real flag set.
func reference() flagref.Reference {
	fs, _ := flagSet()
	return flagref.Reference{
		Binary: "gpushare-scheduler",
		Source: "cmd/gpushare-scheduler",
		Intro: "The shim's per-GPU lock and memory-budget scheduler run on its own, outside the node agent: for " +
			"the GPU benchmarks and for trying the shim on a machine without Kubernetes " +
			"([shim.md](../shim.md)). The agent runs the same scheduler with its own flags.",
		Commands: []flagref.Command{{Name: "gpushare-scheduler", Flags: fs}},
	}
}

// TestFlagReference compares docs/reference/gpushare-scheduler-flags.md with the scheduler's flag set
// (with UPDATE_REFERENCE=1, make generate, it writes the file) and sees a planted flag fail it.
func TestFlagReference(t *testing.T) {
	flagref.Test(t, flagReference, reference, os.Getenv("UPDATE_REFERENCE") != "")
}
