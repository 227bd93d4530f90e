// Package mps runs nvidia-cuda-mps-control daemons: one per MPS GPU (the device plugin's clients), and one
// per (GPU, namespace) for the DRA kubelet plugin's claims (tenants.go), so that tenants of different
// namespaces share no daemon. Each daemon has its own pipe and log directory under a configurable root, so
// a client fault takes down only that daemon's MPS, and a size-capped tmpfs of its own as /dev/shm (shm.go,
// launch.go), which only its clients mount. The manager applies the default active-thread percentage and
// pinned device memory limit through the control pipe, watches the daemons and restarts a dead one with
// exponential backoff, reports state and client count, and quits a daemon when its GPU leaves MPS (or its
// namespace's last claim goes). Every command goes through runner.Runner.
package mps

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/gpusharing/gpusharing/agent/hostpath"
	"github.com/gpusharing/gpusharing/agent/outcome"
	"github.com/gpusharing/gpusharing/agent/procfs"
	"github.com/gpusharing/gpusharing/agent/runner"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// PIDFile is the file the control daemon writes into its pipe directory.
const PIDFile = "nvidia-cuda-mps-control.pid"

// State is a daemon's state as status reports it; the API owns the values.
type State = v1alpha1.MPSDaemonState

// Daemon states, the API's.
const (
	StateStarting   = v1alpha1.MPSDaemonStarting
	StateRunning    = v1alpha1.MPSDaemonRunning
	StateRestarting = v1alpha1.MPSDaemonRestarting
	StateFailed     = v1alpha1.MPSDaemonFailed
)

// Settings are what the agent applies to a GPU's daemon.
type Settings struct {
	// ActiveThreadPercentage is the default active thread percentage of new servers; 0 leaves 100.
	ActiveThreadPercentage int32
	// PinnedMemoryLimitMiB is the default pinned device memory limit per client; 0 means none.
	PinnedMemoryLimitMiB int64
}

// Status is one daemon's state.
type Status struct {
	State    State
	PID      int
	Clients  int
	Restarts int
	Settings Settings
	// LastError is why the daemon last failed to start, for condition messages.
	LastError string
	// ReadyIn is how long the last start took until the pipe answered.
	ReadyIn time.Duration
}

// Config configures a Manager.
type Config struct {
	// Control is the path of nvidia-cuda-mps-control.
	Control string
	// Root holds one directory per GPU uuid with pipe/, log/ and shm/ inside, and ns/<namespace>/ with
	// the same three for each namespace's daemon on that GPU (agent/hostpath).
	Root string
	// Launcher is an executable with the mps-launch subcommand (Launch), normally the agent itself. The
	// manager mounts a tmpfs of ShmSize on each daemon's shm/ and starts the daemon through the launcher,
	// which makes that tmpfs the daemon's /dev/shm. Empty starts the daemon directly in the agent's own
	// namespace with shm/ a plain directory: for tests of the command sequence and nothing else, as the
	// daemon then does not share memory with the clients the device plugin mounts shm/ into.
	Launcher string
	// ShmSize caps each daemon's tmpfs in bytes; default DefaultShmSize.
	ShmSize int64
	// ProcRoot is the proc filesystem used to tell a live daemon from a zombie; default /proc.
	ProcRoot string
	// Runner runs the commands.
	Runner runner.Runner
	// Clock drives backoff; default the real clock.
	Clock clock.WithTicker
	// CommandTimeout bounds each control command; default 10s.
	CommandTimeout time.Duration
	// StartTimeout bounds the wait for a started daemon's pid file; default 10s.
	StartTimeout time.Duration
	// BackoffInitial and BackoffMax bound the restart backoff; defaults 1s and 5m.
	BackoffInitial, BackoffMax time.Duration
	// WatchInterval is how often Run checks the daemons; default 5s.
	WatchInterval time.Duration
	// Notify is called with a GPU uuid when the state or client count of one of its daemons changes.
	Notify func(uuid string)
}

// Manager owns the MPS daemons of one node.
type Manager struct {
	cfg Config
	// ops serializes what starts and stops daemons (Ensure, Stop, Check), so the watcher and a reconcile
	// pass never both restart the same daemon; mu guards the fields and is never held across a command.
	ops     sync.Mutex
	mu      sync.Mutex
	daemons map[key]*daemon
}

// key names one daemon: a GPU's own (ns empty), or one namespace's on a GPU.
type key struct{ gpu, ns string }

func (k key) String() string {
	if k.ns == "" {
		return k.gpu
	}
	return k.gpu + " (namespace " + k.ns + ")"
}

type daemon struct {
	key       key
	settings  Settings
	state     State
	pid       int
	restarts  int
	clients   int
	lastErr   string
	readyIn   time.Duration
	backoff   time.Duration
	nextStart time.Time
	startedAt time.Time
}

// New returns a Manager with defaults filled in.
func New(cfg Config) *Manager {
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.CommandTimeout == 0 {
		cfg.CommandTimeout = 10 * time.Second
	}
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = 10 * time.Second
	}
	if cfg.BackoffInitial == 0 {
		cfg.BackoffInitial = time.Second
	}
	if cfg.BackoffMax == 0 {
		cfg.BackoffMax = 5 * time.Minute
	}
	if cfg.WatchInterval == 0 {
		cfg.WatchInterval = 5 * time.Second
	}
	if cfg.ShmSize <= 0 {
		cfg.ShmSize = DefaultShmSize
	}
	return &Manager{cfg: cfg, daemons: map[key]*daemon{}}
}

// PipeDir is the GPU's CUDA_MPS_PIPE_DIRECTORY, which clients (and the device plugin) must use.
func (m *Manager) PipeDir(uuid string) string { return m.pipeDir(key{gpu: uuid}) }

// LogDir is the GPU's CUDA_MPS_LOG_DIRECTORY.
func (m *Manager) LogDir(uuid string) string { return m.logDir(key{gpu: uuid}) }

// dir is the daemon's directory, which holds pipe/, log/, shm/ and the agent's pid record.
func (m *Manager) dir(k key) string {
	if k.ns == "" {
		return filepath.Join(m.cfg.Root, k.gpu)
	}
	return hostpath.MPSTenantDir(m.cfg.Root, k.gpu, k.ns)
}

func (m *Manager) pipeDir(k key) string {
	if k.ns == "" {
		return hostpath.MPSPipeDir(m.cfg.Root, k.gpu)
	}
	return hostpath.MPSTenantPipeDir(m.cfg.Root, k.gpu, k.ns)
}

func (m *Manager) logDir(k key) string { return filepath.Join(m.dir(k), "log") }

func (m *Manager) env(k key) []string {
	return []string{"CUDA_MPS_PIPE_DIRECTORY=" + m.pipeDir(k), "CUDA_MPS_LOG_DIRECTORY=" + m.logDir(k)}
}

// Status returns the state of the GPU's daemon, and false when the manager runs none for the GPU.
// Clients counts the clients of the GPU's namespace daemons too: they use the same GPU.
func (m *Manager) Status(uuid string) (Status, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, ok := m.daemons[key{gpu: uuid}]
	if !ok {
		return Status{}, false
	}
	st := d.status()
	for k, t := range m.daemons {
		if k.gpu == uuid && k.ns != "" {
			st.Clients += t.clients
		}
	}
	return st, true
}

func (d *daemon) status() Status {
	return Status{State: d.state, PID: d.pid, Clients: d.clients, Restarts: d.restarts, Settings: d.settings, LastError: d.lastErr, ReadyIn: d.readyIn}
}

// Satisfied reports whether the GPU's daemon runs with these settings. It runs no command: it checks
// that the daemon the manager started is alive.
func (m *Manager) Satisfied(uuid string, s Settings) (bool, error) {
	return m.satisfied(key{gpu: uuid}, s)
}

func (m *Manager) satisfied(k key, s Settings) (bool, error) {
	m.mu.Lock()
	d, ok := m.daemons[k]
	m.mu.Unlock()
	if !ok {
		return false, nil
	}
	alive, err := m.alive(d.pid)
	if err != nil {
		return false, err
	}
	return alive && d.state == StateRunning && d.settings == s, nil
}

// Ensure makes the GPU's daemon run with the settings: it adopts a daemon a previous agent left
// running, starts one when there is none, and restarts one whose settings differ (refusing with GPUBusy
// while clients are connected). A daemon waiting out its restart backoff is reported, not forced.
func (m *Manager) Ensure(ctx context.Context, uuid string, s Settings) (Status, error) {
	m.ops.Lock()
	defer m.ops.Unlock()
	return m.ensure(ctx, key{gpu: uuid}, s)
}

// ensure is Ensure for any daemon; m.ops must be held. A namespace's daemon is never restarted for new
// settings: its namespace's clients keep it, and the settings are sent to it for the servers it starts
// later.
func (m *Manager) ensure(ctx context.Context, k key, s Settings) (Status, error) {
	if ok, err := m.satisfied(k, s); err != nil {
		return Status{}, err
	} else if ok {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.daemons[k].status(), nil
	}
	log := logr.FromContextOrDiscard(ctx).WithValues("gpu", k.gpu)
	if k.ns != "" {
		log = log.WithValues("namespace", k.ns)
	}

	m.mu.Lock()
	d, known := m.daemons[k]
	m.mu.Unlock()

	if !known {
		// A daemon from a previous run of the agent: adopt it and re-apply the settings, which are lost
		// only with the daemon.
		if pid, ok := m.runningPID(k); ok {
			if restart, err := m.offItsShm(ctx, k, pid); err != nil {
				return Status{}, err
			} else if restart {
				d = &daemon{key: k, state: StateStarting}
				m.mu.Lock()
				m.daemons[k] = d
				m.mu.Unlock()
				return m.start(ctx, d, s)
			}
			log.Info("Adopting MPS daemon", "pid", pid)
			d = &daemon{key: k, pid: pid, state: StateStarting, startedAt: m.cfg.Clock.Now()}
			if err := m.applySettings(ctx, k, s); err != nil {
				return Status{}, err
			}
			d.settings, d.state = s, StateRunning
			m.mu.Lock()
			m.daemons[k] = d
			m.mu.Unlock()
			return d.status(), nil
		}
		d = &daemon{key: k, state: StateStarting}
		m.mu.Lock()
		m.daemons[k] = d
		m.mu.Unlock()
		return m.start(ctx, d, s)
	}

	m.mu.Lock()
	state, pid, settings := d.state, d.pid, d.settings
	m.mu.Unlock()
	if alive, _ := m.alive(pid); state == StateRunning && !alive {
		// The pass noticed the death before the watcher did: restart now and count it.
		m.mu.Lock()
		d.restarts++
		m.mu.Unlock()
		log.Info("MPS daemon died; restarting", "pid", pid)
		return m.start(ctx, d, s)
	}
	if state == StateRestarting || state == StateFailed {
		m.mu.Lock()
		st := d.status()
		m.mu.Unlock()
		return st, outcome.Newf(v1alpha1.ReasonMPSDaemonFailed, "MPS daemon for %s is down (%d restarts, last error: %s); next start in backoff", k, st.Restarts, st.LastError)
	}
	if settings != s && k.ns != "" {
		if err := m.applySettings(ctx, k, s); err != nil {
			return Status{}, err
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		d.settings = s
		return d.status(), nil
	}
	if settings != s {
		clients, err := m.clients(ctx, k)
		if err != nil {
			return Status{}, err
		}
		if clients > 0 {
			return Status{}, &outcome.Error{Reason: v1alpha1.ReasonGPUBusy, Message: fmt.Sprintf("changing MPS settings restarts the daemon, which would disturb %d MPS clients", clients)}
		}
		log.Info("Restarting MPS daemon for new settings", "pid", pid)
		if err := m.quit(ctx, k, pid); err != nil {
			return Status{}, err
		}
	}
	return m.start(ctx, d, s)
}

// start launches the daemon, waits for its pid file and applies the settings.
func (m *Manager) start(ctx context.Context, d *daemon, s Settings) (Status, error) {
	k := d.key
	log := logr.FromContextOrDiscard(ctx).WithValues("gpu", k.gpu)
	if k.ns != "" {
		log = log.WithValues("namespace", k.ns)
	}
	began := m.cfg.Clock.Now()
	err := m.launch(ctx, k, s)

	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		d.lastErr = err.Error()
		d.state = StateFailed
		d.pid = 0
		d.backoff = nextBackoff(d.backoff, m.cfg.BackoffInitial, m.cfg.BackoffMax)
		d.nextStart = m.cfg.Clock.Now().Add(d.backoff)
		return d.status(), &outcome.Error{Reason: v1alpha1.ReasonMPSDaemonFailed, Message: fmt.Sprintf("starting the MPS daemon for %s: %v", k, err), Err: err}
	}
	pid, _ := m.runningPID(k)
	d.pid, d.settings, d.state, d.lastErr = pid, s, StateRunning, ""
	d.startedAt = m.cfg.Clock.Now()
	d.readyIn = d.startedAt.Sub(began)
	log.Info("Started MPS daemon", "pid", pid, "readyIn", d.readyIn.String())
	return d.status(), nil
}

func (m *Manager) launch(ctx context.Context, k key, s Settings) error {
	for _, dir := range []string{m.pipeDir(k), m.logDir(k), m.shmDir(k)} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	// A stale pid file from a dead daemon would make the wait below return at once.
	if err := os.Remove(filepath.Join(m.pipeDir(k), PIDFile)); err != nil && !os.IsNotExist(err) {
		return err
	}
	cmd := runner.Cmd{Path: m.cfg.Control, Args: []string{"-d"}, Env: append(m.env(k), "CUDA_VISIBLE_DEVICES="+k.gpu), Timeout: m.cfg.CommandTimeout}
	if m.isolated() {
		if err := m.mountShm(k); err != nil {
			return err
		}
		cmd.Path, cmd.Args = m.cfg.Launcher, []string{LaunchCommand, m.shmDir(k), m.cfg.Control, "-d"}
	}
	if _, err := m.cfg.Runner.Run(ctx, cmd); err != nil {
		return err
	}
	started := func() (bool, error) { return m.adoptStarted(k), nil }
	if err := m.waitFor(ctx, started); err != nil {
		return fmt.Errorf("the daemon wrote no live pid to %s within %s: %w", filepath.Join(m.pipeDir(k), PIDFile), m.cfg.StartTimeout, err)
	}
	return m.applySettings(ctx, k, s)
}

func (m *Manager) applySettings(ctx context.Context, k key, s Settings) error {
	if s.ActiveThreadPercentage > 0 {
		if _, err := m.control(ctx, k, fmt.Sprintf("set_default_active_thread_percentage %d", s.ActiveThreadPercentage)); err != nil {
			return err
		}
	}
	if s.PinnedMemoryLimitMiB > 0 {
		// The daemon sees only this GPU (CUDA_VISIBLE_DEVICES=<uuid>), so it is device 0.
		if _, err := m.control(ctx, k, fmt.Sprintf("set_default_device_pinned_mem_limit 0 %dM", s.PinnedMemoryLimitMiB)); err != nil {
			return err
		}
	}
	return nil
}

// control sends one command to a control daemon through its pipe directory.
func (m *Manager) control(ctx context.Context, k key, command string) (string, error) {
	res, err := m.cfg.Runner.Run(ctx, runner.Cmd{Path: m.cfg.Control, Env: m.env(k), Stdin: command + "\n", Timeout: m.cfg.CommandTimeout})
	return res.Stdout, err
}

// clients counts the clients of every MPS server of a daemon.
func (m *Manager) clients(ctx context.Context, k key) (int, error) {
	out, err := m.control(ctx, k, "get_server_list")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, server := range strings.Fields(out) {
		list, err := m.control(ctx, k, "get_client_list "+server)
		if err != nil {
			return 0, err
		}
		n += len(strings.Fields(list))
	}
	return n, nil
}

// Running reports whether a daemon runs for the GPU, whether or not this manager started it. It runs
// no command.
func (m *Manager) Running(uuid string) bool {
	_, ok := m.runningPID(key{gpu: uuid})
	return ok
}

// Stop quits the GPU's daemon and its namespaces' daemons (ones this manager started or ones a previous
// agent left), refusing with GPUBusy while any of them has clients connected. A GPU without a daemon
// costs no command.
func (m *Manager) Stop(ctx context.Context, uuid string) error {
	m.ops.Lock()
	defer m.ops.Unlock()
	for _, ns := range m.tenantsOf(uuid) {
		if err := m.stop(ctx, key{gpu: uuid, ns: ns}); err != nil {
			return err
		}
	}
	return m.stop(ctx, key{gpu: uuid})
}

// stop is Stop for one daemon; m.ops must be held.
func (m *Manager) stop(ctx context.Context, k key) error {
	pid, ok := m.runningPID(k)
	if !ok {
		m.mu.Lock()
		delete(m.daemons, k)
		m.mu.Unlock()
		// A daemon that died (or a Stop whose unmount failed after the quit) may have left the tmpfs.
		return m.removeDirs(k)
	}
	clients, err := m.clients(ctx, k)
	if err != nil {
		return err
	}
	if clients > 0 {
		return &outcome.Error{Reason: v1alpha1.ReasonGPUBusy, Message: fmt.Sprintf("quitting the MPS daemon for %s would disturb %d MPS clients", k, clients)}
	}
	log := logr.FromContextOrDiscard(ctx).WithValues("gpu", k.gpu, "pid", pid)
	if k.ns != "" {
		log = log.WithValues("namespace", k.ns)
	}
	log.Info("Quitting MPS daemon")
	if err := m.quit(ctx, k, pid); err != nil {
		return err
	}
	m.mu.Lock()
	delete(m.daemons, k)
	m.mu.Unlock()
	// Only now, with the daemon gone and no client connected, is the tmpfs unmounted.
	return m.removeDirs(k)
}

// removeDirs unmounts a stopped daemon's tmpfs and removes its shm directory; a namespace's daemon
// leaves nothing behind (its pipe and log directories and the pid record go too), so no later look finds
// a namespace that holds no claim.
func (m *Manager) removeDirs(k key) error {
	if err := m.unmountShm(k); err != nil {
		return err
	}
	if k.ns == "" {
		return nil
	}
	return os.RemoveAll(m.dir(k))
}

// offItsShm decides, for a running daemon a previous agent left, whether it must be restarted because
// its /dev/shm is not its tmpfs (it was started before the agent gave each GPU one): clients the
// device plugin now mounts the tmpfs into could not reach it. It quits that daemon when no client is
// connected and refuses with GPUBusy while some are, as for new settings. It mounts the tmpfs (adopting
// one that is there) in every case.
func (m *Manager) offItsShm(ctx context.Context, k key, pid int) (bool, error) {
	if !m.isolated() {
		return false, nil
	}
	if err := m.mountShm(k); err != nil {
		return false, err
	}
	on, err := m.onItsShm(k, pid)
	if err != nil || on {
		return false, err
	}
	clients, err := m.clients(ctx, k)
	if err != nil {
		return false, err
	}
	if clients > 0 {
		return false, &outcome.Error{Reason: v1alpha1.ReasonGPUBusy, Message: fmt.Sprintf("the MPS daemon %d does not use its GPU's /dev/shm tmpfs (an earlier agent started it); it is restarted onto it once its %d MPS clients are gone", pid, clients)}
	}
	logr.FromContextOrDiscard(ctx).Info("Restarting MPS daemon onto its GPU's /dev/shm tmpfs", "gpu", k.gpu, "pid", pid)
	return true, m.quit(ctx, k, pid)
}

func (m *Manager) quit(ctx context.Context, k key, pid int) error {
	if _, err := m.control(ctx, k, "quit"); err != nil {
		return err
	}
	exited := func() (bool, error) { alive, err := m.alive(pid); return !alive, err }
	if err := m.waitFor(ctx, exited); err != nil {
		return fmt.Errorf("MPS daemon %d did not exit within %s of quit: %w", pid, m.cfg.StartTimeout, err)
	}
	return nil
}

// waitFor polls done until it is true, for at most StartTimeout. The bound is on a host process (its
// pid file, its exit), so it is a context deadline on the wall clock, like a command's timeout, and not
// a decision of the agent's clock.
func (m *Manager) waitFor(ctx context.Context, done func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.StartTimeout)
	defer cancel()
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-poll.C:
		}
	}
}

// runningPID reads the agent's record of the daemon's pid and reports the pid when that process is
// alive and is the daemon.
func (m *Manager) runningPID(k key) (int, bool) {
	pid, ok := readPID(m.recordPath(k))
	if !ok {
		return 0, false
	}
	return pid, m.isOurDaemon(k, pid)
}

// The daemon writes its pid into its pipe directory, which MPS client pods mount read-write: a pod could
// point the agent at any process (to have it adopt a dead daemon as running, or a live one as its own).
// The agent therefore reads that file once, right after it started the daemon, checks the process (it
// carries the daemon's host pipe directory in its environment, which no pod process has: pods see the
// directory at their own path), and from then on trusts only its own record, daemon.pid in the daemon's
// directory beside pipe/ and log/, which no pod mounts.
func (m *Manager) recordPath(k key) string {
	return filepath.Join(m.dir(k), "daemon.pid")
}

// adoptStarted takes the pid the daemon just wrote into its pipe directory, if it is the daemon this
// agent started, and records it.
func (m *Manager) adoptStarted(k key) bool {
	pid, ok := readPID(filepath.Join(m.pipeDir(k), PIDFile))
	if !ok || !m.isOurDaemon(k, pid) {
		return false
	}
	return writeFileAtomic(m.recordPath(k), []byte(strconv.Itoa(pid)+"\n")) == nil
}

// isOurDaemon: pid runs and its environment names the daemon's host pipe directory.
func (m *Manager) isOurDaemon(k key, pid int) bool {
	if alive, err := m.alive(pid); err != nil || !alive {
		return false
	}
	env, err := os.ReadFile(filepath.Join(m.cfg.ProcRoot, strconv.Itoa(pid), "environ"))
	if err != nil {
		return false
	}
	want := "CUDA_MPS_PIPE_DIRECTORY=" + m.pipeDir(k)
	for _, kv := range strings.Split(string(env), "\x00") {
		if kv == want {
			return true
		}
	}
	return false
}

func readPID(path string) (int, bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	return pid, err == nil && pid > 0
}

func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// alive reports whether pid runs. A zombie counts as dead (and is reaped when it is our child: the
// agent may be PID 1 of its container, which inherits the daemonized control process).
func (m *Manager) alive(pid int) (bool, error) {
	if pid <= 0 {
		return false, nil
	}
	err := syscall.Kill(pid, 0)
	if errors.Is(err, syscall.ESRCH) {
		return false, nil
	}
	if err != nil && !errors.Is(err, syscall.EPERM) {
		return false, err
	}
	stat, err := procfs.StatFields(m.cfg.ProcRoot, pid)
	if err != nil {
		return !os.IsNotExist(err), nil
	}
	if len(stat) > 0 && stat[0] == "Z" {
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		return false, nil
	}
	return true, nil
}

func nextBackoff(cur, initial, maxBackoff time.Duration) time.Duration {
	if cur == 0 {
		return initial
	}
	return min(cur*2, maxBackoff)
}

// Alive reports whether pid runs; a zombie counts as dead.
func (m *Manager) Alive(pid int) bool {
	ok, err := m.alive(pid)
	return err == nil && ok
}
