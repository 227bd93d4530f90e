package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/gpusharing/gpusharing/agent/shiminstall"
)

// runInstallShim installs the image's libgpushare.so on the host for the device plugin to mount into
// pods: a versioned file and an atomic rename of the stable name, never a write over a file that running
// shim processes have mapped (the DaemonSet's init container runs it on every agent rollout).
func runInstallShim(args []string) int {
	fs, from, to := installShimFlags()
	_ = fs.Parse(args)
	res, err := shiminstall.Install(*from, *to)
	if err != nil {
		fmt.Fprintln(os.Stderr, "install-shim:", err)
		return 1
	}
	if res.Changed {
		fmt.Printf("installed %s; %s/%s points to it; removed old builds %v\n", res.Path, *to, shiminstall.LibraryName, res.Pruned)
	} else {
		fmt.Printf("%s is already in force\n", res.Path)
	}
	return 0
}

// installShimFlags is the flag set of agent install-shim.
func installShimFlags() (fs *flag.FlagSet, from, to *string) {
	fs = flag.NewFlagSet("install-shim", flag.ExitOnError)
	from = fs.String("from", "/opt/gpusharing/libgpushare.so", "the library this image ships")
	to = fs.String("to", "/usr/lib/gpusharing", "host directory (a hostPath) that will hold <version>/libgpushare.so and the link libgpushare.so")
	return fs, from, to
}
