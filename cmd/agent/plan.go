package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/mig"
)

// planResult is one layout's plan, as `agent plan` prints it (one JSON object per line).
type planResult struct {
	Layout  string         `json:"layout"`
	Fits    bool           `json:"fits"`
	Message string         `json:"message,omitempty"`
	Create  []plannedPlace `json:"create,omitempty"`
}

type plannedPlace struct {
	Profile   string        `json:"profile"`
	ProfileID int           `json:"profileID"`
	Placement gpu.Placement `json:"placement"`
}

// runPlan plans MIG layouts against one GPU's profiles, read from NVML (or from an inventory JSON file
// with --inventory), as if the GPU had no instances. It changes nothing on the GPU.
func runPlan(args []string) int {
	fs, lib, index, invFile := planFlags()
	_ = fs.Parse(args)

	inv, err := loadInventory(*lib, *invFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "plan:", err)
		return 1
	}
	var dev *gpu.Device
	for i := range inv.Devices {
		if inv.Devices[i].Index == *index {
			dev = &inv.Devices[i]
		}
	}
	if dev == nil {
		fmt.Fprintf(os.Stderr, "plan: no GPU with index %d\n", *index)
		return 1
	}
	enc := json.NewEncoder(os.Stdout)
	for _, layout := range fs.Args() {
		want, err := mig.ParseLayout(layout)
		if err != nil {
			fmt.Fprintln(os.Stderr, "plan:", err)
			return 1
		}
		res := planResult{Layout: layout}
		plan, err := mig.MakePlan(dev.Profiles, nil, want)
		var nf *mig.NoFitError
		switch {
		case errors.As(err, &nf):
			res.Message = nf.Message
		case err != nil:
			fmt.Fprintln(os.Stderr, "plan:", err)
			return 1
		default:
			res.Fits = true
			for _, c := range plan.Create {
				res.Create = append(res.Create, plannedPlace{Profile: c.Profile.Name, ProfileID: c.Profile.ID, Placement: c.At})
			}
		}
		if err := enc.Encode(res); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return 0
}

func loadInventory(lib, file string) (gpu.Inventory, error) {
	var inv gpu.Inventory
	if file != "" {
		data, err := os.ReadFile(file)
		if err != nil {
			return inv, err
		}
		return inv, json.Unmarshal(data, &inv)
	}
	gpus, shutdown := openGPUs(lib)
	defer shutdown()
	return gpus.Inventory(context.Background())
}

// planFlags is the flag set of agent plan.
func planFlags() (fs *flag.FlagSet, lib *string, index *int, invFile *string) {
	fs = flag.NewFlagSet("plan", flag.ExitOnError)
	lib = fs.String("nvml-lib", "", "path of libnvidia-ml.so.1 (default: the dynamic loader's search)")
	index = fs.Int("gpu", 0, "index of the GPU whose profiles to plan against")
	invFile = fs.String("inventory", "", "plan against this `file`, the JSON that agent inventory printed, instead of NVML")
	return fs, lib, index, invFile
}
