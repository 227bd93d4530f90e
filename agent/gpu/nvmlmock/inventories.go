package nvmlmock

import (
	"embed"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/gpusharing/gpusharing/agent/gpu"
)

// The simulated GPUs take their identity and MIG geometry from these files, not from go-nvml's mock
// tables, whose H100 sizes, starts and ids are not the real GPU's: a layout the planner refuses on a real
// H100 would otherwise reach Ready in the demo. inventories/README.md says where each file comes from.
//
//go:embed inventories/*.json
var inventories embed.FS

// Recorded inventory files.
const (
	// InventoryH100 is `agent inventory` on a real H100 80GB HBM3, re-read by test/gpu/stack/run.sh.
	InventoryH100 = "h100-80gb-hbm3.json"
	// InventoryA100 is the A100-SXM4-40GB as NVIDIA's MIG user guide documents it.
	InventoryA100 = "a100-sxm4-40gb.json"
)

// Inventory returns a recorded inventory by file name (InventoryH100, InventoryA100).
func Inventory(name string) (gpu.Inventory, error) {
	var inv gpu.Inventory
	data, err := inventories.ReadFile("inventories/" + name)
	if err != nil {
		return inv, err
	}
	if err := json.Unmarshal(data, &inv); err != nil {
		return inv, fmt.Errorf("inventory %s: %w", name, err)
	}
	if len(inv.Devices) == 0 {
		return inv, fmt.Errorf("inventory %s holds no device", name)
	}
	return inv, nil
}

// mustInventory is Inventory for the embedded files, which a test pins: a broken one is a build defect.
func mustInventory(name string) (gpu.Inventory, gpu.Device) {
	inv, err := Inventory(name)
	if err != nil {
		panic(err)
	}
	return inv, inv.Devices[0]
}

// architecture names the NVML architecture of a product, for the few calls that report it.
func architecture(product string) (arch uint32, cudaMajor int) {
	if strings.Contains(product, "A100") {
		return 7, 8 // nvml.DEVICE_ARCH_AMPERE
	}
	return 9, 9 // nvml.DEVICE_ARCH_HOPPER
}
