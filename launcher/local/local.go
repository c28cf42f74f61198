// Package local runs replicas as process groups on this machine: Ferry's embedded default infra,
// used on a laptop and in every end-to-end test.
//
// Each instance has its own directory under Options.Dir, holding the script it runs, its
// output log and instance.json. Everything a controller needs to find and stop an instance is in
// that directory, so a controller that restarts adopts the processes an earlier one started:
// replicas run in their own session and process group and outlive the controller. A replica
// works in a directory of its own outside Options.Dir (under Options.WorkRoot), so that its
// working directory is not next to the controller's state (the token, the store).
package local

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/buckets"
	"github.com/ferryserve/ferry/launcher/nodefiles"
	"github.com/ferryserve/ferry/launcher/privnet"
)

// Options configures a Provider.
type Options struct {
	// Dir holds one directory per instance plus logs/ for the output of terminated ones, e.g.
	// $FERRY_HOME/local. It is created (0700) if missing.
	Dir string
	// WorkRoot is where each instance gets its working directory (a fresh 0700
	// "ferry-replica-*" directory, removed by Terminate), which holds the copy of the task's
	// workdir; default os.TempDir(). It must not be inside Dir.
	WorkRoot string
	// PathPrepend lists directories put first on the replicas' PATH; the controller passes the
	// ferry binary's directory so that `run: ferry replica-sim` works without installing it.
	PathPrepend []string
	// Host is the address replicas bind and the proxy dials; default 127.0.0.1.
	Host string
	// StopGrace is how long Terminate waits after SIGTERM before SIGKILL; default 10s, time for
	// a server to finish in-flight requests.
	StopGrace time.Duration
	// CheckpointRoot holds one directory per job checkpoint claim (JobSpec.CheckpointClaim),
	// shared by the job's nodes and kept across its recoveries until CleanupJob; default
	// Dir/checkpoints.
	CheckpointRoot string
	// Supervisor is the ferry binary, which runs a fixed-port replica under `ferry
	// local-supervise` (supervise.go) so that its binds of 0.0.0.0 go to its own address; ""
	// runs such replicas as any other, where only binds of $FERRY_HOST share the port.
	Supervisor string
	// PrivateNetwork puts the serving port of every service replica in Ferry's private network
	// (launcher/privnet), where only Ferry's dialers reach it, instead of on loopback, where
	// every user of the host does. It needs Supervisor, Linux 5.9+ and unprivileged user
	// namespaces; without them replicas listen on loopback and the log says why. Jobs' nodes
	// stay on loopback.
	PrivateNetwork bool
	// Logger receives one line per launch and termination; nil means no logging.
	Logger *zap.Logger
	// Buckets reads the s3:// and gs:// sources of file_mounts; nil is buckets.New with the
	// machine's own credentials.
	Buckets nodefiles.Buckets
	// Accelerators are this machine's GPUs (the ferry config's local.accelerators): instances
	// asking for them hold them, and a launch that does not fit waits or preempts
	// (capacity.go). GPUs not declared here are not counted.
	Accelerators []configs.Accelerator
	// CPUs and MemoryGiB are this machine's declared CPUs and memory (local.cpus,
	// local.memory): instances asking for cpus or memory hold them (capacity.go); 0 counts
	// none.
	CPUs, MemoryGiB float64
	// PreemptionCooldown is how long a job preempted on local is safe from another
	// preemption; default DefaultPreemptionCooldown.
	PreemptionCooldown time.Duration
}

// Defaults for Options.
const (
	DefaultHost      = "127.0.0.1"
	DefaultStopGrace = 10 * time.Second
)

const (
	// pollInterval paces the checks for a process group that is going away.
	pollInterval = 20 * time.Millisecond
	// killWait bounds the wait for a SIGKILLed group to vanish.
	killWait = 5 * time.Second
	// reapWait bounds the wait for our own Wait goroutine to record an exit status.
	reapWait = 2 * time.Second
	// portQuarantine keeps a port we handed out from being handed out again while its replica
	// may not have bound it yet.
	portQuarantine = time.Minute
)

// Provider launches instances as local process groups. It is safe for concurrent use.
type Provider struct {
	opts Options
	log  *zap.Logger

	mu sync.Mutex
	// children are the instances this process started, and can therefore wait for.
	children map[string]*child
	// recentPorts maps a port handed out to when, see portQuarantine.
	recentPorts map[int]time.Time
	// recentHosts maps a loopback address handed to a replica to when, so that two launches
	// do not pick the same one before either has written its instance.json.
	recentHosts map[string]time.Time
	// mounts are the mounted buckets kept in step with instances' directories (mounts.go).
	mounts localMounts
	// net is the client of the private network's helper, with PrivateNetwork (replicahost.go).
	net *privnet.Client
	// netWarned is the last reason logged for replicas on loopback, so it is logged once.
	netWarned string

	// capMu makes each launch's capacity check and reservation one step (capacity.go);
	// pending are the launches holding GPUs before their instance.json exists, and
	// preemptedAt when each job was last preempted here.
	capMu       sync.Mutex
	pending     map[string]holder
	preemptedAt map[string]time.Time
}

// child tracks one process this Provider started; done closes once Wait returned.
type child struct {
	done   chan struct{}
	reason string
}

var (
	_ launcher.Provider  = (*Provider)(nil)
	_ launcher.LogSource = (*Provider)(nil)
)

// New returns a Provider that keeps its instances under opts.Dir.
func New(opts Options) (*Provider, error) {
	if opts.Dir == "" {
		return nil, fmt.Errorf("local provider: Dir is required")
	}
	launcher.SetDefault(&opts.Host, DefaultHost)
	launcher.SetDefault(&opts.StopGrace, DefaultStopGrace)
	launcher.SetDefault(&opts.PreemptionCooldown, DefaultPreemptionCooldown)
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Buckets == nil {
		opts.Buckets = buckets.New(buckets.Options{})
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("local provider: %w", err)
	}
	opts.Dir = dir
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("local provider: %w", err)
	}
	launcher.SetDefault(&opts.WorkRoot, os.TempDir())
	launcher.SetDefault(&opts.CheckpointRoot, filepath.Join(opts.Dir, checkpointsDir))
	if opts.WorkRoot, err = filepath.Abs(opts.WorkRoot); err != nil {
		return nil, fmt.Errorf("local provider: %w", err)
	}
	if rel, err := filepath.Rel(opts.Dir, opts.WorkRoot); err == nil && !strings.HasPrefix(rel, "..") {
		return nil, fmt.Errorf("local provider: replicas' work root %s is inside %s, beside the controller's state", opts.WorkRoot, opts.Dir)
	}
	p := &Provider{
		opts:        opts,
		log:         opts.Logger.With(zap.String("infra", configs.InfraLocal)),
		children:    map[string]*child{},
		recentPorts: map[int]time.Time{},
		recentHosts: map[string]time.Time{},
		pending:     map[string]holder{},
		preemptedAt: map[string]time.Time{},
	}
	if opts.PrivateNetwork && superviseSupported && loopback(opts.Host) {
		// Connected on the first launch; the proxy and the prober of this process dial
		// private addresses with it, also those of replicas an earlier controller started.
		p.net = privnet.NewClient(filepath.Join(opts.Dir, privnet.SocketName))
		privnet.SetDefault(p.net)
	}
	return p, nil
}

// loopback reports whether host is a loopback address: only then can replicas move to the
// private network's loopback.
func loopback(host string) bool {
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Launch starts spec as `bash run.sh` in a new session and process group and returns once the
// process exists. A replica whose run takes $FERRY_PORT gets a free port on Options.Host; one
// whose run fixes the task's port gets a loopback address of its own (FERRY_HOST) with that
// port (see fixedPort).
func (p *Provider) Launch(ctx context.Context, spec launcher.Spec) (launcher.Instance, error) {
	if err := validName(spec.Name); err != nil {
		return launcher.Instance{}, err
	}
	if strings.TrimSpace(spec.Run) == "" {
		return launcher.Instance{}, fmt.Errorf("%w: instance %q has an empty run command", launcher.ErrInvalid, spec.Name)
	}
	if err := ctx.Err(); err != nil {
		return launcher.Instance{}, err
	}
	id, err := newID(spec.Name)
	if err != nil {
		return launcher.Instance{}, err
	}
	host, err := p.nodeHost(spec)
	if err != nil {
		return launcher.Instance{}, err
	}
	release, err := p.reserve(spec, id)
	if err != nil {
		return launcher.Instance{}, err
	}
	defer release() // once instance.json holds the claim, or the launch failed
	port, netns := spec.Port, p.privateNet(spec)
	switch {
	case spec.Job == nil && fixedPort(spec) && netns != "":
		host, err = p.privateHost()
	case spec.Job == nil && fixedPort(spec):
		// The run fixes its port (`--port 8000`): an address of its own keeps it, as on a
		// machine of its own, so two replicas can both serve on it.
		host, err = p.replicaHost(port)
	case host == p.opts.Host || port == 0:
		// Replicas that take $FERRY_PORT share one address, so each needs a port of its own;
		// a job's node has an address of its own and keeps the task's port.
		if port, err = p.allocatePort(host); err == nil && netns != "" {
			host, err = p.privateHost()
		}
	}
	if err != nil {
		return launcher.Instance{}, err
	}
	dir := filepath.Join(p.opts.Dir, id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return launcher.Instance{}, fmt.Errorf("create instance dir: %w", err)
	}
	work, err := os.MkdirTemp(p.opts.WorkRoot, workDirPrefix+id+"-")
	if err != nil {
		_ = os.RemoveAll(dir)
		return launcher.Instance{}, fmt.Errorf("create working directory: %w", err)
	}
	if err := p.syncFiles(ctx, spec, dir, work); err != nil {
		_ = os.RemoveAll(dir)
		p.removeWorkDir(id, work)
		return launcher.Instance{}, err
	}
	if ckpt := p.checkpointDir(spec); ckpt != "" {
		if err := os.MkdirAll(ckpt, 0o700); err != nil {
			_ = os.RemoveAll(dir)
			return launcher.Instance{}, fmt.Errorf("create checkpoint directory: %w", err)
		}
	}
	inst, err := p.start(dir, work, id, hostPort{host, port, netns}, spec)
	if err != nil {
		_ = os.RemoveAll(dir)
		p.removeWorkDir(id, work)
		return launcher.Instance{}, err
	}
	p.log.Info("launched instance", zap.String("instance", id), zap.String("name", spec.Name),
		zap.String("endpoint", inst.Endpoint))
	return inst, nil
}

// supervised reports whether spec runs under the supervisor that moves its binds of 0.0.0.0
// to its own address: a replica whose run fixes its port, and every node of a multi-node
// replica (a gang of a service: each node has an address of its own, and SkyPilot's serving
// examples bind the same port on 0.0.0.0 on every node).
func supervised(spec launcher.Spec) bool {
	return fixedPort(spec) && (spec.Job == nil || spec.Labels[launcher.LabelService] != "")
}

// hostPort is where a replica serves: its address and port, and the private network's helper
// socket when that address is in the private network.
type hostPort struct {
	host  string
	port  int
	netns string
}

// start runs spec's script from dir in the working directory work.
func (p *Provider) start(dir, work, id string, at hostPort, spec launcher.Spec) (launcher.Instance, error) {
	host, port := at.host, at.port
	script := filepath.Join(dir, scriptFile)
	if err := os.WriteFile(script, []byte(nodefiles.RenderScript(spec)), 0o600); err != nil {
		return launcher.Instance{}, fmt.Errorf("write run script: %w", err)
	}
	out, err := os.OpenFile(filepath.Join(dir, logFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return launcher.Instance{}, fmt.Errorf("open output log: %w", err)
	}
	defer out.Close() // the child holds its own descriptor

	argv := []string{"bash", script}
	if spec.Job != nil {
		// A job's status must outlive this controller: the wrapper writes it where a later
		// one reads it. A node killed by a signal writes nothing: it did not end by itself.
		argv = []string{"bash", "-c", `bash "$0"; rc=$?; printf '%d\n' "$rc" > "$1.tmp" && mv "$1.tmp" "$1"; exit "$rc"`,
			script, filepath.Join(dir, exitStatusFile)}
	}
	env := append(p.environ(spec, host, port), filesEnv(spec, dir, work)...)
	env = append(env, EnvInstance+"="+id) // marks every process of the instance (proc.go)
	if spec.GitWorkdir != nil && spec.Workdir == "" {
		// The script clones the repository into the working directory (nodefiles.GitCloneShell).
		env = append(env, nodefiles.EnvWorkdir+"="+work)
	}
	cmd, err := p.startCommand(id, at, spec, argv, work, env, out)
	if err != nil {
		return launcher.Instance{}, err
	}
	pid := cmd.Process.Pid
	// The child is not reaped before Wait, so its stat is readable even if it already exited.
	st, err := readProcStat(pid)
	if err != nil {
		_ = signalGroup(pid, syscall.SIGKILL)
		_ = cmd.Wait()
		return launcher.Instance{}, fmt.Errorf("read process start time: %w", err)
	}
	meta := &metadata{
		ID:         id,
		Name:       spec.Name,
		Labels:     cloneLabels(spec.Labels),
		PID:        pid,
		PGID:       pid,
		StartTime:  st.StartTime,
		Endpoint:   net.JoinHostPort(host, strconv.Itoa(port)),
		LaunchedAt: time.Now().UTC(),
	}
	if spec.Job != nil {
		meta.Job, meta.StopGrace = true, spec.Job.Grace
	}
	if want := p.wants(spec); want.claim.Name != "" || want.cpus > 0 || want.mem > 0 {
		if want.claim.Name != "" {
			meta.GPU = &want.claim
		}
		meta.CPUs, meta.MemoryGiB = want.cpus, want.mem
		meta.Priority, meta.Preemptible = want.priority, want.preemptible
	}
	if host != p.opts.Host {
		meta.Host = host
	}
	meta.WorkDir = work
	if err := saveMetadata(dir, meta); err != nil {
		_ = signalGroup(pid, syscall.SIGKILL)
		_ = cmd.Wait()
		return launcher.Instance{}, fmt.Errorf("write instance metadata: %w", err)
	}
	c := &child{done: make(chan struct{})}
	p.mu.Lock()
	p.children[id] = c
	p.mu.Unlock()
	go p.wait(dir, cmd, c)
	return p.instance(meta, launcher.StateRunning, ""), nil
}

// startCommand starts argv for instance id in work with env, output to out: under the
// replica supervisor where the instance needs one, else as it is.
func (p *Provider) startCommand(id string, at hostPort, spec launcher.Spec, argv []string, work string, env []string, out *os.File) (*exec.Cmd, error) {
	if superviseSupported && p.opts.Supervisor != "" && (supervised(spec) || at.netns != "") {
		// supervise.go: binds of the task's port on 0.0.0.0 move to host. A supervisor that
		// does not start leaves the replica as it was without one, unless its port was to be
		// in the private network, which only the supervisor can put it in.
		cmd := replicaCommand(p.opts.Supervisor, superviseArgs(at.host, at.port, at.netns, argv), work, env, out)
		err := cmd.Start()
		if err == nil {
			return cmd, nil
		}
		if at.netns != "" {
			return nil, fmt.Errorf("start replica supervisor: %w", err)
		}
		p.log.Warn("start replica supervisor; running without", zap.String("instance", id), zap.Error(err))
	}
	cmd := replicaCommand(argv[0], argv[1:], work, env, out)
	if err := cmd.Start(); err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return nil, fmt.Errorf("%w: start replica: %v", launcher.ErrInvalid, err)
		}
		return nil, fmt.Errorf("start replica: %w", err)
	}
	return cmd, nil
}

// replicaCommand runs name args in a new session, in work with env, output to out.
func replicaCommand(name string, args []string, work string, env []string, out *os.File) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = work
	cmd.Env = env
	cmd.Stdin = nil // /dev/null
	cmd.Stdout = out
	cmd.Stderr = out
	// A new session: its own process group (pgid = pid) so Terminate can signal every process
	// the replica started, no controlling terminal, and no signal from the controller's
	// terminal or its death reaches it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	return cmd
}

// wait reaps a child we started and records how it ended, which only its parent can learn.
func (p *Provider) wait(dir string, cmd *exec.Cmd, c *child) {
	err := cmd.Wait()
	reason := "process exited"
	var code *int
	if cmd.ProcessState != nil {
		reason = cmd.ProcessState.String()
		if c := cmd.ProcessState.ExitCode(); c >= 0 {
			code = &c
		}
	} else if err != nil {
		reason = err.Error()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// The file is written before done closes, so whoever saw done finds the reason on disk too.
	c.reason = reason
	defer close(c.done)
	meta, err := loadMetadata(dir)
	if err != nil {
		return // terminated and removed already
	}
	if meta.ExitReason == "" {
		meta.ExitReason = reason
		meta.ExitCode = code
		meta.ExitedAt = time.Now().UTC()
		if err := saveMetadata(dir, meta); err != nil {
			p.log.Warn("record exit status", zap.String("instance", meta.ID), zap.Error(err))
		}
	}
	p.log.Info("instance exited", zap.String("instance", meta.ID), zap.String("reason", reason))
}

// List returns the instances under Dir whose labels match selector, with StateRunning while the
// process started for them is alive and StateTerminated (and why) once it is not.
func (p *Provider) List(ctx context.Context, selector map[string]string) ([]launcher.Instance, error) {
	entries, err := os.ReadDir(p.opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("list local instances: %w", err)
	}
	var out []launcher.Instance
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if !e.IsDir() || e.Name() == logsDir || e.Name() == checkpointsDir {
			continue
		}
		meta, err := loadMetadata(filepath.Join(p.opts.Dir, e.Name()))
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				p.log.Warn("skip unreadable instance", zap.String("dir", e.Name()), zap.Error(err))
			}
			continue // being launched or removed
		}
		if !launcher.Matches(meta.Labels, selector) {
			continue
		}
		state, reason := p.state(meta)
		inst := p.instance(meta, state, reason)
		if state == launcher.StateTerminated {
			inst.ExitCode = p.exitCode(meta)
		}
		out = append(out, inst)
	}
	return out, nil
}

// state checks whether meta's process is still the one launched and still running.
func (p *Provider) state(meta *metadata) (launcher.State, string) {
	if meta.PreemptedBy != "" {
		return launcher.StatePreempted, meta.PreemptedBy
	}
	if meta.ExitReason != "" {
		return launcher.StateTerminated, meta.ExitReason
	}
	p.mu.Lock()
	c := p.children[meta.ID]
	p.mu.Unlock()
	if c != nil {
		select {
		case <-c.done:
			return launcher.StateTerminated, c.reason
		default:
		}
	}
	reason := leaderStatus(meta)
	if reason == "" {
		return launcher.StateRunning, ""
	}
	if c != nil {
		// Our own child just exited; its Wait is about to report the exact status.
		select {
		case <-c.done:
			return launcher.StateTerminated, c.reason
		case <-time.After(reapWait):
		}
	}
	return launcher.StateTerminated, reason
}

// Terminate stops the instance's whole process group (SIGTERM, then SIGKILL after StopGrace),
// keeps its output as logs/<name>.log and removes the rest of its directory. An unknown or
// already removed id is not an error.
func (p *Provider) Terminate(ctx context.Context, id string) error {
	if err := validID(id); err != nil {
		return err
	}
	dir := filepath.Join(p.opts.Dir, id)
	meta, err := loadMetadata(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("terminate %s: %w", id, err)
	}
	if err := p.stopGroup(ctx, meta); err != nil {
		return fmt.Errorf("terminate %s: %w", id, err)
	}
	p.mu.Lock()
	c := p.children[id]
	p.mu.Unlock()
	if c != nil {
		select {
		case <-c.done:
		case <-time.After(reapWait):
		}
	}
	p.stopMounts(id) // their last round, before their directories go

	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.children, id)
	logs := filepath.Join(p.opts.Dir, logsDir)
	if err := os.MkdirAll(logs, 0o700); err != nil {
		return fmt.Errorf("terminate %s: keep log: %w", id, err)
	}
	if err := os.Rename(filepath.Join(dir, logFile), filepath.Join(logs, meta.Name+".log")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("terminate %s: keep log: %w", id, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("terminate %s: %w", id, err)
	}
	p.removeWorkDir(meta.ID, meta.WorkDir)
	p.log.Info("terminated instance", zap.String("instance", id), zap.String("name", meta.Name))
	return nil
}

// stopGroup signals the instance's process group and waits for it to vanish. Cancelling ctx
// cuts the grace period short; it never leaves the group running.
func (p *Provider) stopGroup(ctx context.Context, meta *metadata) error {
	// A preempted instance had its SIGTERM (capacity.go): a second could cut short the
	// checkpoint it is writing in its grace.
	return p.endGroup(ctx, meta, meta.PreemptedBy == "")
}

// endGroup is stopGroup, sending SIGTERM first only when term is set.
func (p *Provider) endGroup(ctx context.Context, meta *metadata, term bool) error {
	if !instanceAlive(meta) {
		return nil
	}
	if term {
		if err := signalInstance(meta, syscall.SIGTERM); err != nil {
			return err
		}
	}
	grace := p.opts.StopGrace
	if meta.StopGrace > 0 {
		grace = meta.StopGrace
	}
	if waitGone(ctx, meta, grace) {
		return nil
	}
	if err := signalInstance(meta, syscall.SIGKILL); err != nil {
		return err
	}
	if waitGone(context.Background(), meta, killWait) {
		return nil
	}
	return fmt.Errorf("process group %d (or a process of the instance that left it) still alive after SIGKILL", meta.PGID)
}

// workDirPrefix starts the name of every working directory Launch makes.
const workDirPrefix = "ferry-replica-"

// removeWorkDir removes the working directory Launch made for instance id (perhaps in another
// controller process, with another WorkRoot): only a directory named for that instance, never
// anything else a damaged instance.json might name.
func (p *Provider) removeWorkDir(id, work string) {
	if work == "" || !filepath.IsAbs(work) || !strings.HasPrefix(filepath.Base(work), workDirPrefix+id+"-") {
		return
	}
	if err := os.RemoveAll(work); err != nil {
		p.log.Warn("remove replica working directory", zap.String("dir", work), zap.Error(err))
	}
}

// waitGone polls until meta's instance has no live process, d passes or ctx ends.
func waitGone(ctx context.Context, meta *metadata, d time.Duration) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		if !instanceAlive(meta) {
			return true
		}
		select {
		case <-ctx.Done():
			return !instanceAlive(meta)
		case <-deadline.C:
			return !instanceAlive(meta)
		case <-tick.C:
		}
	}
}

// LogPath returns the instance's output log: in its directory while it exists, in logs/ after
// Terminate, so that the output of a dead replica can still be read.
func (p *Provider) LogPath(id string) (string, error) {
	if err := validID(id); err != nil {
		return "", err
	}
	live := filepath.Join(p.opts.Dir, id, logFile)
	if _, err := os.Stat(live); err == nil {
		return live, nil
	}
	if name, ok := nameFromID(id); ok {
		kept := filepath.Join(p.opts.Dir, logsDir, name+".log")
		if _, err := os.Stat(kept); err == nil {
			return kept, nil
		}
	}
	return "", fmt.Errorf("%w: no log for %s", launcher.ErrNotFound, id)
}

func (p *Provider) instance(meta *metadata, state launcher.State, reason string) launcher.Instance {
	ip := meta.Host
	if ip == "" {
		ip = p.opts.Host
	}
	return launcher.Instance{
		IP:           ip,
		ID:           meta.ID,
		Name:         meta.Name,
		Labels:       cloneLabels(meta.Labels),
		Endpoint:     meta.Endpoint,
		Infra:        configs.InfraLocal,
		PricePerHour: 0,
		State:        state,
		LaunchedAt:   meta.LaunchedAt,
		Reason:       reason,
	}
}

// allocatePort asks the kernel for a free port on Host. The port is released before the replica
// binds it, so ports handed out recently are skipped to keep two replicas off the same one.
func (p *Provider) allocatePort(host string) (int, error) {
	for range 20 {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return 0, fmt.Errorf("allocate port on %s: %w", host, err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		now := time.Now()
		p.mu.Lock()
		for q, at := range p.recentPorts {
			if now.Sub(at) > portQuarantine {
				delete(p.recentPorts, q)
			}
		}
		_, taken := p.recentPorts[port]
		if !taken {
			p.recentPorts[port] = now
		}
		p.mu.Unlock()
		if !taken {
			return port, nil
		}
	}
	return 0, fmt.Errorf("%w: no free port on %s", launcher.ErrNoCapacity, host)
}

const idPrefix = "local-"

// newID returns "local-<name>-<6 random hex>": readable in `ls`, unique across relaunches.
func newID(name string) (string, error) {
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return idPrefix + name + "-" + hex.EncodeToString(b[:]), nil
}

// nameFromID inverts newID.
func nameFromID(id string) (string, bool) {
	rest, ok := strings.CutPrefix(id, idPrefix)
	if !ok || len(rest) < 8 || rest[len(rest)-7] != '-' {
		return "", false
	}
	return rest[:len(rest)-7], true
}

// validName keeps names usable as file names: they become directory and log file names.
func validName(name string) error {
	if name == "" || len(name) > 128 || name[0] == '.' || name[0] == '-' {
		return fmt.Errorf("%w: instance name %q must be 1-128 characters, not starting with '.' or '-'", launcher.ErrInvalid, name)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return fmt.Errorf("%w: instance name %q may only hold letters, digits, '-', '_' and '.'", launcher.ErrInvalid, name)
		}
	}
	return nil
}

// validID rejects ids that could escape Dir. Other ids that name nothing are merely unknown.
func validID(id string) error {
	if id == "" || id == "." || id == ".." || id == logsDir || id == checkpointsDir || strings.ContainsAny(id, `/\`+"\x00") {
		return fmt.Errorf("%w: %q is not a local instance id", launcher.ErrInvalid, id)
	}
	return nil
}

func cloneLabels(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
