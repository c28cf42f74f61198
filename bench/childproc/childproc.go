// Package childproc starts the processes a bench driver measures (backends, proxies, replicas),
// each in its own process group and optionally pinned to a CPU with taskset, and stops them by
// group id: on request, when the driver returns, and on Ctrl-C or SIGTERM. It never signals a
// process it did not start.
package childproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// stopGrace is how long a group has to exit after SIGTERM before it gets SIGKILL.
const stopGrace = 5 * time.Second

// Spec describes one child process.
type Spec struct {
	// Name labels the process in errors and names its log file.
	Name string
	// Argv is the command and its arguments; Argv[0] is looked up in PATH.
	Argv []string
	// Env is added to the driver's environment.
	Env []string
	// CPU pins the process (and its children) with taskset when ≥ 0. Go programs pinned to one
	// CPU start with GOMAXPROCS=1.
	CPU int
}

// Proc is a running child, the leader of its own process group.
type Proc struct {
	Name    string
	PID     int
	LogPath string

	cmd     *exec.Cmd
	logFile *os.File
	exited  chan struct{}
	err     error // set before exited closes
}

// Exited is closed when the process has exited.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Err is the process's exit error; valid once Exited is closed.
func (p *Proc) Err() error { return p.err }

// LogTail returns up to n bytes from the end of the process's output, to say why it failed.
func (p *Proc) LogTail(n int) string {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return ""
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}

// Group owns every process a driver starts, so that one deferred Close (or a signal) stops them
// all. It is safe for concurrent use.
type Group struct {
	logDir string

	mu      sync.Mutex
	procs   []*Proc
	started int // numbers the log files
	closed  bool
}

// NewGroup returns a group whose children log to files in logDir.
func NewGroup(logDir string) (*Group, error) {
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, err
	}
	return &Group{logDir: logDir}, nil
}

// StopOnSignal stops every child and exits with status 130 on SIGINT or SIGTERM. It returns a
// function that cancels the handling, for a normal return.
func (g *Group) StopOnSignal() (cancel func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-ch:
			fmt.Fprintf(os.Stderr, "\n%v: stopping child processes\n", s)
			g.Close()
			os.Exit(130)
		case <-done:
		}
	}()
	return func() {
		signal.Stop(ch)
		close(done)
	}
}

// Start launches spec in a new process group. Its output goes to a log file named after it.
func (g *Group) Start(spec Spec) (*Proc, error) {
	if len(spec.Argv) == 0 {
		return nil, fmt.Errorf("childproc: %s: empty command", spec.Name)
	}
	argv := spec.Argv
	if spec.CPU >= 0 {
		taskset, err := exec.LookPath("taskset")
		if err != nil {
			return nil, fmt.Errorf("childproc: %s: pinning needs taskset (util-linux; run scripts/bench-deps.sh): %w", spec.Name, err)
		}
		argv = append([]string{taskset, "-c", strconv.Itoa(spec.CPU)}, argv...)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, fmt.Errorf("childproc: %s: group is closed", spec.Name)
	}
	g.started++
	logPath := filepath.Join(g.logDir, fmt.Sprintf("%02d-%s.log", g.started, spec.Name))
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), spec.Env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("childproc: start %s: %w", spec.Name, err)
	}
	p := &Proc{Name: spec.Name, PID: cmd.Process.Pid, LogPath: logPath, cmd: cmd, logFile: logFile, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = logFile.Close()
		close(p.exited)
	}()
	g.procs = append(g.procs, p)
	return p, nil
}

// Stop sends SIGTERM to p's process group, then SIGKILL to the group if its leader is still
// alive after a grace period, and waits for the leader to exit. The group is signalled only
// while its leader is alive, so its id cannot have been reused. nginx's master stops its
// worker on SIGTERM itself. Stopping an exited process does nothing.
func (g *Group) Stop(p *Proc) {
	select {
	case <-p.exited:
	default:
		_ = syscall.Kill(-p.PID, syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(stopGrace):
			_ = syscall.Kill(-p.PID, syscall.SIGKILL)
			<-p.exited
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, q := range g.procs {
		if q == p {
			g.procs = append(g.procs[:i], g.procs[i+1:]...)
			break
		}
	}
}

// Close stops every child, the most recently started first, and refuses further starts.
func (g *Group) Close() {
	g.mu.Lock()
	g.closed = true
	procs := append([]*Proc(nil), g.procs...)
	g.mu.Unlock()
	var wg sync.WaitGroup
	for i := len(procs) - 1; i >= 0; i-- {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.Stop(procs[i])
		}()
	}
	wg.Wait()
}

// ErrExited is returned by WaitHTTP when the process exits before it is ready.
var ErrExited = errors.New("childproc: process exited before it was ready")

// WaitHTTP polls url until it answers 200, p exits, or timeout passes.
func WaitHTTP(ctx context.Context, p *Proc, url string, timeout time.Duration) error {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(timeout)
	for {
		resp, err := client.Get(url)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("childproc: %s: %s not ready after %v", p.Name, url, timeout)
		}
		select {
		case <-p.exited:
			return fmt.Errorf("%w: %s: %v: %s", ErrExited, p.Name, p.err, p.LogTail(400))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
