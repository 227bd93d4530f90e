package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// Component is a control-plane binary from bin/ (kube-scheduler, kube-controller-manager; make
// control-plane builds them) running against an Env.
type Component struct {
	cmd *exec.Cmd
	log *os.File
	// LogPath is where its output goes.
	LogPath string
}

// Scheduler is the real kube-scheduler.
type Scheduler = Component

// StartScheduler runs bin/kube-scheduler against e with an admin kubeconfig written to dir, its log in
// dir/kube-scheduler.log. It dies with the calling process; Stop ends it earlier.
func (e *Env) StartScheduler(dir string) (*Scheduler, error) {
	return e.startComponent(dir, "kube-scheduler")
}

// StartControllerManager runs bin/kube-controller-manager against e with only the named controllers
// (for example "resourcequota", which fills in a ResourceQuota's status: the quota admission plugin
// refuses pods a quota covers until it has), its log in dir/kube-controller-manager.log.
func (e *Env) StartControllerManager(dir string, controllers ...string) (*Component, error) {
	if len(controllers) == 0 {
		return nil, fmt.Errorf("kube-controller-manager: name the controllers to run")
	}
	return e.startComponent(dir, "kube-controller-manager", "--controllers="+strings.Join(controllers, ","))
}

func (e *Env) startComponent(dir, name string, extra ...string) (*Component, error) {
	bin := filepath.Join(e.BinDir, name)
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("%s: run 'make control-plane' (it builds %s from the Go module proxy): %w", bin, name, err)
	}
	kcfg, err := e.AdminKubeconfig(dir)
	if err != nil {
		return nil, err
	}
	c := &Component{LogPath: filepath.Join(dir, name+".log")}
	if c.log, err = os.Create(c.LogPath); err != nil {
		return nil, err
	}
	args := append([]string{"--kubeconfig=" + kcfg, "--authentication-kubeconfig=" + kcfg, "--authorization-kubeconfig=" + kcfg,
		"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0", "-v=2"}, extra...)
	c.cmd = exec.Command(bin, args...)
	c.cmd.Stdout, c.cmd.Stderr = c.log, c.log
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with a test binary killed by -timeout
	if err := c.cmd.Start(); err != nil {
		_ = c.log.Close()
		return nil, err
	}
	return c, nil
}

// Stop ends the component and closes its log.
func (c *Component) Stop() {
	_ = c.cmd.Process.Kill()
	_ = c.cmd.Wait()
	_ = c.log.Close()
}

// LogTail is the last n bytes of its log.
func (c *Component) LogTail(n int) string {
	b, _ := os.ReadFile(c.LogPath)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
