package main

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
)

// sleeper starts a process that stays until the test ends, with env added to the test's environment.
func sleeper(t *testing.T, env ...string) uint32 {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return uint32(cmd.Process.Pid)
}

// Over a mock GPU listing a pod's process that never connects and a host process, the command names the
// pod's within the grace and one read, never the host's, and passes; asked to expect a pod that is never
// named, or to never name the one it names, it fails.
func TestUmcheckNamesThePodsProcessAndFailsWhenExpectationsDoNot(t *testing.T) {
	dropper := sleeper(t, "UMCHECK_POD=dropper")
	host := sleeper(t)
	srv := nvmlmock.NewA100(1)
	srv.GPUs[0].SetUsage(nvmlmock.Proc(dropper, 1<<30, 0), nvmlmock.Proc(host, 1<<30, 0))
	uuid := srv.GPUs[0].UUID
	check := func(expect, never []string) error {
		dir, err := os.MkdirTemp("", "um")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
		return run(srv, dir, uuid, 2*time.Second, 100*time.Millisecond, 500*time.Millisecond, expect, never)
	}
	if err := check([]string{"dropper"}, nil); err != nil {
		t.Errorf("the dropper expected: %v", err)
	}
	if err := check([]string{"dropper", "client"}, nil); err == nil {
		t.Error("passed expecting a pod that has no process")
	}
	if err := check(nil, []string{"dropper"}); err == nil {
		t.Error("passed while a pod it must never name was named")
	}
}
