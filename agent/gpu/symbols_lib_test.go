package gpu_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpusharing/gpusharing/agent/gpu"
)

// envOldNVML names the library the child process of TestAnOlderDriverLibraryIsReadNotCalledPast loads.
const envOldNVML = "GPUSHARING_TEST_OLD_NVML"

// The real go-nvml over a real library that lacks functions (testdata/oldnvml.c): the inventory runs in
// a child process, since a call of a missing function ends the process with "symbol lookup error" (exit
// 127) and no Go code can recover from it.
func TestAnOlderDriverLibraryIsReadNotCalledPast(t *testing.T) {
	if path := os.Getenv(envOldNVML); path != "" {
		inventoryOf(path)
		return
	}
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("no gcc to build the library")
	}
	lib := filepath.Join(t.TempDir(), "libnvidia-ml.so.1")
	if out, err := exec.Command(gcc, "-shared", "-fPIC", "-o", lib, "testdata/oldnvml.c").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestAnOlderDriverLibraryIsReadNotCalledPast$")
	cmd.Env = append(os.Environ(), envOldNVML+"="+lib)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the inventory over the older library: %v\n%s", err, out)
	}
	var got struct {
		Missing []string
		Devices []gpu.Device
		Err     string
	}
	line := out
	if i := strings.Index(string(out), "{"); i >= 0 {
		line = out[i:]
	}
	if err := json.NewDecoder(strings.NewReader(string(line))).Decode(&got); err != nil {
		t.Fatalf("child output %q: %v", out, err)
	}
	if got.Err != "" || len(got.Devices) != 2 || got.Devices[1].Product != "Tesla T4" || got.Devices[1].MIGCapable || got.Devices[1].MemoryBytes != 16<<30 {
		t.Errorf("inventory = %+v", got)
	}
	for _, want := range []string{"nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetMigMode"} {
		if !strings.Contains(strings.Join(got.Missing, " "), want) {
			t.Errorf("missing functions %v lack %s", got.Missing, want)
		}
	}
}

// inventoryOf prints, as JSON, the inventory over the library at path and the functions it lacks.
func inventoryOf(path string) {
	lib := nvml.New(nvml.WithLibraryPath(path))
	if r := lib.Init(); r != nvml.SUCCESS {
		_ = json.NewEncoder(os.Stdout).Encode(map[string]string{"Err": "nvmlInit: " + r.Error()})
		return
	}
	n := gpu.NewNVML(lib)
	inv, err := n.Inventory(context.Background())
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	_ = json.NewEncoder(os.Stdout).Encode(map[string]any{"Missing": n.MissingFunctions(), "Devices": inv.Devices, "Err": msg})
}
