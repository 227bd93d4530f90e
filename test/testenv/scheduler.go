package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

// Scheduler is a control-plane process (make control-plane builds them) running against an Env: the real
// kube-scheduler, or kube-controller-manager with its ResourceClaim controller.
type Scheduler struct {
	cmd *exec.Cmd
	log *os.File
	// LogPath is where its output goes.
	LogPath string
}

// StartScheduler runs bin/kube-scheduler against e with an admin kubeconfig written to dir, its log in
// dir/kube-scheduler.log. It dies with the calling process; Stop ends it earlier.
func (e *Env) StartScheduler(dir string) (*Scheduler, error) {
	return e.startComponent("kube-scheduler", dir)
}

// StartClaimController runs bin/kube-controller-manager against e with its ResourceClaim controller alone,
// which creates the claims of pods' ResourceClaimTemplates, takes an ended pod out of its claims'
// reservedFor and deallocates a claim nobody reserves: what gives a deleted workload's devices back to
// the scheduler. Its log is dir/kube-controller-manager.log.
func (e *Env) StartClaimController(dir string) (*Scheduler, error) {
	return e.startComponent("kube-controller-manager", dir, "--controllers=resourceclaim-controller")
}

func (e *Env) startComponent(name, dir string, args ...string) (*Scheduler, error) {
	bin := filepath.Join(e.BinDir, name)
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("%s: run 'make control-plane' (it builds %s from the Go module proxy): %w", bin, name, err)
	}
	kcfg, err := e.AdminKubeconfig(dir)
	if err != nil {
		return nil, err
	}
	s := &Scheduler{LogPath: filepath.Join(dir, name+".log")}
	if s.log, err = os.Create(s.LogPath); err != nil {
		return nil, err
	}
	s.cmd = exec.Command(bin, append([]string{"--kubeconfig=" + kcfg, "--authentication-kubeconfig=" + kcfg, "--authorization-kubeconfig=" + kcfg,
		"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0", "-v=2"}, args...)...)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with a test binary killed by -timeout
	if err := s.cmd.Start(); err != nil {
		_ = s.log.Close()
		return nil, err
	}
	return s, nil
}

// Stop ends the scheduler and closes its log.
func (s *Scheduler) Stop() {
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	_ = s.log.Close()
}

// LogTail is the last n bytes of its log.
func (s *Scheduler) LogTail(n int) string {
	b, _ := os.ReadFile(s.LogPath)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
