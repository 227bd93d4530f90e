package main

import (
	"os"
	"testing"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/internal/flagref"
)

const flagReference = "../../docs/reference/agent-flags.md"

// reference is the agent's flag reference over its real flag sets.
func reference() flagref.Reference {
	var o options
	v := flagValues{dp: share.DefaultConfig(), draCfg: dra.PluginConfig{}.WithDefaults()}
	fs, _ := flagSet(&o, &v)
	inventory, _ := inventoryFlags()
	plan, _, _, _ := planFlags()
	install, _, _ := installShimFlags()
	return flagref.Reference{
		Binary: "agent",
		Source: "cmd/agent",
		Intro: "The node agent (a DaemonSet, one per GPU node): it converges the node's GPUs to its GPUNode and " +
			"publishes what is applied ([agent.md](../agent.md)). Run without a subcommand it serves the node; the " +
			"subcommands below are read-only tools, or the DaemonSet's init step.",
		Commands: []flagref.Command{
			{Name: "agent", Flags: fs},
			{Name: "agent inventory", Intro: "Prints what NVML reports about every GPU as JSON; changes nothing.", Flags: inventory},
			{Name: "agent plan", Intro: "`agent plan [flags] LAYOUT...` plans MIG layouts (\"3g.40gb x1 + 1g.10gb x4\") " +
				"against one GPU's real profiles as if it had no instances, one JSON line per layout; changes nothing.", Flags: plan},
			{Name: "agent install-shim", Intro: "Installs the image's libgpushare.so on the host beside the builds " +
				"running processes have loaded (the DaemonSet's init container).", Flags: install},
		},
	}
}

// TestFlagReference compares docs/reference/agent-flags.md with the agent's flag sets (with
// UPDATE_REFERENCE=1, make generate, it writes the file) and sees a planted flag fail it.
func TestFlagReference(t *testing.T) {
	t.Setenv("NODE_NAME", "") // --node-name defaults to $NODE_NAME: the reference shows it unset
	flagref.Test(t, flagReference, reference, os.Getenv("UPDATE_REFERENCE") != "")
}
