// Package servicekit holds what the end-to-end service benchmarks in bench/ (updates, faults)
// share: driving one FERRY_HOME through the ferry CLI and the controller's API (child
// processes, controller pid and SIGKILL, service status, local replica instances), and a
// closed-loop chat-completion load against the service's endpoint that records every request.
// What each driver measures and judges stays in the driver.
package servicekit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ferryserve/ferry/bench/childproc"
	"github.com/ferryserve/ferry/bench/procstat"
	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/internal/home"
)

// ProcRoot is where process state is read.
const ProcRoot = "/proc"

// Ferry drives one FERRY_HOME and one service in it: the CLI as child processes (each in its
// own process group, logged under the group's log directory), the controller's API for
// status, and the local launcher's instance files for the replica processes.
type Ferry struct {
	Bin     string
	Home    home.Home
	Env     []string
	Group   *childproc.Group
	Service string

	mu sync.Mutex
	// seen is every local replica instance observed during the run, by instance id, so that
	// a process whose instance directory is gone can still be found by the leak checks.
	seen map[string]Instance
}

// NewFerry prepares homeDir for the ferry binary bin and the service: the children's
// environment names the home, turns the gateway off, sets the controller's metrics listener to
// metricsAddr ("off" for none) and puts bin's directory first on PATH (replicas' run lines
// call `ferry replica-sim`).
func NewFerry(bin, homeDir, service, metricsAddr string, group *childproc.Group) (*Ferry, error) {
	abs, err := filepath.Abs(homeDir)
	if err != nil {
		return nil, err
	}
	h := home.Home{Dir: abs}
	if err := h.Ensure(); err != nil {
		return nil, err
	}
	env := []string{
		home.Env + "=" + abs,
		// Other sessions on this machine use the default gateway and metrics ports.
		"FERRY_GATEWAY_ADDR=off",
		"FERRY_METRICS_ADDR=" + metricsAddr,
		// Replicas' run lines call `ferry replica-sim`: the binary under test must come first.
		"PATH=" + filepath.Dir(bin) + string(os.PathListSeparator) + os.Getenv("PATH"),
	}
	return &Ferry{Bin: bin, Home: h, Env: env, Group: group, Service: service, seen: map[string]Instance{}}, nil
}

// Start runs `ferry ARGS` in the background; its output goes to the group's NN-name.log.
func (f *Ferry) Start(name string, args ...string) (*childproc.Proc, error) {
	return f.Group.Start(childproc.Spec{Name: name, Argv: append([]string{f.Bin}, args...), Env: f.Env, CPU: -1})
}

// Run runs `ferry ARGS` to its end, at most timeout, and returns its output. A non-zero exit
// is an error that quotes the output's last lines.
func (f *Ferry) Run(ctx context.Context, name string, timeout time.Duration, args ...string) (string, error) {
	p, err := f.Start(name, args...)
	if err != nil {
		return "", err
	}
	err = WaitExit(ctx, f.Group, p, timeout)
	out := ReadLog(p)
	if err != nil {
		return out, fmt.Errorf("ferry %s: %w", strings.Join(args, " "), err)
	}
	if p.Err() != nil {
		return out, fmt.Errorf("ferry %s: %w: %s", strings.Join(args, " "), p.Err(), LastLines(out, 4))
	}
	return out, nil
}

// WaitExit waits until p exits, stopping it (and erring) when ctx ends or timeout passes.
func WaitExit(ctx context.Context, group *childproc.Group, p *childproc.Proc, timeout time.Duration) error {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	defer group.Stop(p) // forgets an exited process; stops one still running
	select {
	case <-p.Exited():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return fmt.Errorf("still running after %v (stopped)", timeout)
	}
}

// ReadLog is p's whole log so far.
func ReadLog(p *childproc.Proc) string {
	b, _ := os.ReadFile(p.LogPath)
	return string(b)
}

// LastLines is the last n non-empty lines of s, joined by " / ".
func LastLines(s string, n int) string {
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines[max(0, len(lines)-n):], " / ")
}

// apiClient is a client for the controller running now: its socket and token are read on
// every call, so a restarted controller is found.
func (f *Ferry) apiClient() (*api.Client, error) {
	info, err := f.Home.ReadInfo()
	if err != nil {
		return nil, err
	}
	tok, err := os.ReadFile(f.Home.TokenPath())
	if err != nil {
		return nil, err
	}
	return api.ClientFor(f.Home, info, strings.TrimSpace(string(tok)))
}

// Status is the service as the controller reports it.
func (f *Ferry) Status(ctx context.Context) (api.ServiceStatus, error) {
	c, err := f.apiClient()
	if err != nil {
		return api.ServiceStatus{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	list, err := c.Services(ctx, f.Service)
	if err != nil {
		return api.ServiceStatus{}, err
	}
	if len(list) != 1 {
		return api.ServiceStatus{}, fmt.Errorf("status of %q: %d services in the answer", f.Service, len(list))
	}
	return list[0], nil
}

// Services is every service as the controller reports it (`serve status`), waiting at most
// timeout for the answer: a large fleet's takes longer than one service's.
func (f *Ferry) Services(ctx context.Context, timeout time.Duration) ([]api.ServiceStatus, error) {
	c, err := f.apiClient()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return c.Services(ctx)
}

// EndpointAddr is the host:port of a status endpoint URL.
func EndpointAddr(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("service endpoint %q is not a URL", endpoint)
	}
	return u.Host, nil
}

// ControllerPID is the pid of the controller running for this home: the one in
// controller.json, if that process is alive, not a zombie, and a ferry controller of this
// home (its command line names the home's log file). 0 when none runs.
func (f *Ferry) ControllerPID() (int, error) {
	info, err := f.Home.ReadInfo()
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if !Alive(info.PID) {
		return 0, nil
	}
	cmdline, err := os.ReadFile(filepath.Join(ProcRoot, strconv.Itoa(info.PID), "cmdline"))
	if err != nil {
		return 0, nil // exited meanwhile
	}
	args := strings.Split(string(bytes.TrimRight(cmdline, "\x00")), "\x00")
	if len(args) < 2 || args[1] != "controller" || !strings.Contains(string(cmdline), f.Home.Dir) {
		return 0, fmt.Errorf("controller.json names pid %d, which is not this home's controller (%q)", info.PID, strings.Join(args, " "))
	}
	return info.PID, nil
}

// Alive reports whether pid is a live, non-zombie process.
func Alive(pid int) bool {
	s, err := procstat.ReadStat(ProcRoot, pid)
	return err == nil && s.State != 'Z'
}

// KillController SIGKILLs the controller and waits until it is gone. It returns the pid.
func (f *Ferry) KillController(ctx context.Context) (int, error) {
	pid, err := f.ControllerPID()
	if err != nil {
		return 0, err
	}
	if pid == 0 {
		return 0, errors.New("no controller is running to kill")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return pid, fmt.Errorf("kill -9 %d: %w", pid, err)
	}
	err = PollUntil(ctx, 5*time.Second, 20*time.Millisecond, func() (bool, error) { return !Alive(pid), nil })
	if err != nil {
		return pid, fmt.Errorf("controller %d still alive after SIGKILL: %w", pid, err)
	}
	return pid, nil
}

// PollUntil calls cond every interval until it returns true or an error, ctx ends, or
// timeout passes.
func PollUntil(ctx context.Context, timeout, interval time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not so after %v", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}

// SleepCtx waits d, or less if ctx ends. It times a load phase; nothing waits on state this way.
func SleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Instance is the part of a local replica's instance.json the drivers use.
type Instance struct {
	ID     string            `json:"id"`
	Labels map[string]string `json:"labels"`
	PID    int               `json:"pid"`
	PGID   int               `json:"pgid"`
}

// IntLabel is the instance's label key as a number (0 when absent or not one).
func (i Instance) IntLabel(key string) int {
	v, _ := strconv.Atoi(i.Labels[key])
	return v
}

// scanInstances records every instance the local launcher has a directory for now.
func (f *Ferry) scanInstances() {
	paths, _ := filepath.Glob(filepath.Join(f.Home.LocalDir(), "*", "instance.json"))
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // terminated meanwhile
		}
		var in Instance
		if json.Unmarshal(b, &in) != nil || in.ID == "" || in.PGID <= 1 {
			continue // being written
		}
		f.seen[in.ID] = in
	}
}

// SeenInstances records the instances the local launcher has now and returns every instance
// seen during the run, those whose directory is gone too, by id.
func (f *Ferry) SeenInstances() []Instance {
	f.scanInstances()
	f.mu.Lock()
	seen := make([]Instance, 0, len(f.seen))
	for _, in := range f.seen {
		seen = append(seen, in)
	}
	f.mu.Unlock()
	sort.Slice(seen, func(i, j int) bool { return seen[i].ID < seen[j].ID })
	return seen
}

// GroupMembers is the processes of process group pgid (nil when it cannot be read).
func GroupMembers(pgid int) []procstat.Stat {
	members, err := procstat.GroupStats(ProcRoot, pgid)
	if err != nil {
		return nil
	}
	return members
}

// ExitCode is p's exit status: 0, the code, or -1 when it was killed by a signal.
func ExitCode(p *childproc.Proc) int {
	var ee interface{ ExitCode() int }
	if errors.As(p.Err(), &ee) {
		return ee.ExitCode()
	}
	if p.Err() != nil {
		return -1
	}
	return 0
}

// OnSignal cancels the run on the first SIGINT or SIGTERM, so that the driver stops its load
// and takes the service and controller down; a second one exits at once. It returns a function
// that stops the handling.
func OnSignal(cancel context.CancelFunc) func() {
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-ch:
			fmt.Fprintf(os.Stderr, "\n%v: stopping; taking the service and the controller down (again to exit at once)\n", s)
			cancel()
		case <-done:
			return
		}
		select {
		case <-ch:
			os.Exit(130)
		case <-done:
		}
	}()
	return func() {
		signal.Stop(ch)
		close(done)
	}
}

// FirstLine is the first non-empty line of s.
func FirstLine(s string) string {
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			return l
		}
	}
	return ""
}
