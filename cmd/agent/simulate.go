package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/test/fakebin"
)

// simulateFlag is --simulate-gpus: MODEL:COUNT[:SEQ] runs the agent over go-nvml's mock DGX (the same
// simulated server the demo runs in-process) with stand-in nvidia-smi and nvidia-cuda-mps-control written
// under --host-root. It exists so the real-node e2e can install the operator's own images and manifests
// on a machine without a GPU; a real node never sets it.
type simulateFlag struct {
	model      string
	gpus, seq  int
	configured bool
	// stateFile and pauseAfter are --simulate-gpus-state and --simulate-gpus-pause-after.
	stateFile  string
	pauseAfter int
}

func (s *simulateFlag) String() string {
	if !s.configured {
		return ""
	}
	return fmt.Sprintf("%s:%d:%d", s.model, s.gpus, s.seq)
}

func (s *simulateFlag) Set(v string) error {
	parts := strings.Split(v, ":")
	if len(parts) < 2 || len(parts) > 3 {
		return fmt.Errorf("want MODEL:COUNT[:SEQ], for example H100:8")
	}
	s.model = parts[0]
	var err error
	if s.gpus, err = strconv.Atoi(parts[1]); err != nil {
		return fmt.Errorf("GPU count %q: %w", parts[1], err)
	}
	if len(parts) == 3 {
		if s.seq, err = strconv.Atoi(parts[2]); err != nil {
			return fmt.Errorf("sequence %q: %w", parts[2], err)
		}
	}
	if _, err := nvmlmock.NewNode(s.model, s.gpus, s.seq); err != nil {
		return err
	}
	s.configured = true
	return nil
}

// simulatedProcessScan is how often the host's processes are read for declared simulated use: well
// inside the accounting's default interval, so a pod's usage shows at the accounting's next read.
const simulatedProcessScan = 2 * time.Second

// simulatedGPUs returns the mock server and writes the stand-in tools into <hostRoot>/simulated-bin,
// pointing o at them unless the flags named others.
func simulatedGPUs(s *simulateFlag, o *options) (gpu.Interface, *nvmlmock.Server, error) {
	server, err := nvmlmock.NewNode(s.model, s.gpus, s.seq)
	if err != nil {
		return nil, nil, err
	}
	if s.pauseAfter > 0 && s.stateFile == "" {
		return nil, nil, fmt.Errorf("--simulate-gpus-pause-after needs --simulate-gpus-state")
	}
	if s.stateFile != "" {
		if err := server.Persist(s.stateFile, nvmlmock.PersistOptions{PauseAfter: s.pauseAfter}); err != nil {
			return nil, nil, err
		}
	}
	dir := filepath.Join(o.hostRoot, "simulated-bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, err
	}
	// A restarted agent finds the stand-in MPS daemons of the one before it (their pid files are in the
	// pipe directories), as the real agent finds real daemons.
	mps, err := fakebin.NewMPSControl(dir)
	if err != nil {
		return nil, nil, err
	}
	smi, err := fakebin.NewNvidiaSMI(dir, false)
	if err != nil {
		return nil, nil, err
	}
	if o.mpsControl == "" {
		o.mpsControl = mps.Path
	}
	if o.nvidiaSMI == "" {
		o.nvidiaSMI = smi.Path
	}
	return gpu.NewNVML(server), server, nil
}
