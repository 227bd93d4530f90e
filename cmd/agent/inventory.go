package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
)

// runInventory prints what NVML reports about every GPU as JSON. It changes nothing.
func runInventory(args []string) int {
	fs, lib := inventoryFlags()
	_ = fs.Parse(args)
	gpus, shutdown := openGPUs(*lib)
	defer shutdown()
	inv, err := gpus.Inventory(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, "inventory:", err)
		return 1
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(inv); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// inventoryFlags is the flag set of agent inventory.
func inventoryFlags() (fs *flag.FlagSet, lib *string) {
	fs = flag.NewFlagSet("inventory", flag.ExitOnError)
	lib = fs.String("nvml-lib", "", "path of libnvidia-ml.so.1 (default: the dynamic loader's search)")
	return fs, lib
}
