package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
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

// procRoot is where the leak checks read processes.
const procRoot = "/proc"

// ferry drives one FERRY_HOME: the CLI as child processes (each in its own process group,
// logged under logs/), the controller's API for status, and the local launcher's instance
// files for which replica processes are alive.
type ferry struct {
	bin   string
	home  home.Home
	env   []string
	group *childproc.Group

	mu sync.Mutex
	// seen is every local replica instance observed during the run, by instance id, so that
	// a process whose instance directory is gone can still be found by the leak checks.
	seen map[string]instance
}

func newFerry(bin, homeDir string, group *childproc.Group) (*ferry, error) {
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
		"FERRY_METRICS_ADDR=off",
		// Replicas' run lines call `ferry replica-sim`: the binary under test must come first.
		"PATH=" + filepath.Dir(bin) + string(os.PathListSeparator) + os.Getenv("PATH"),
	}
	return &ferry{bin: bin, home: h, env: env, group: group, seen: map[string]instance{}}, nil
}

// start runs `ferry ARGS` in the background; its output goes to logs/NN-name.log.
func (f *ferry) start(name string, args ...string) (*childproc.Proc, error) {
	return f.group.Start(childproc.Spec{Name: name, Argv: append([]string{f.bin}, args...), Env: f.env, CPU: -1})
}

// run runs `ferry ARGS` to its end, at most timeout, and returns its output. A non-zero exit
// is an error that quotes the output's last lines.
func (f *ferry) run(ctx context.Context, name string, timeout time.Duration, args ...string) (string, error) {
	p, err := f.start(name, args...)
	if err != nil {
		return "", err
	}
	err = waitExit(ctx, f.group, p, timeout)
	out := readLog(p)
	if err != nil {
		return out, fmt.Errorf("ferry %s: %w", strings.Join(args, " "), err)
	}
	if p.Err() != nil {
		return out, fmt.Errorf("ferry %s: %w: %s", strings.Join(args, " "), p.Err(), lastLines(out, 4))
	}
	return out, nil
}

// waitExit waits until p exits, stopping it (and erring) when ctx ends or timeout passes.
func waitExit(ctx context.Context, group *childproc.Group, p *childproc.Proc, timeout time.Duration) error {
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

func readLog(p *childproc.Proc) string {
	b, _ := os.ReadFile(p.LogPath)
	return string(b)
}

// lastLines is the last n non-empty lines of s, joined by " / ".
func lastLines(s string, n int) string {
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines[max(0, len(lines)-n):], " / ")
}

// exitCode is p's exit status: 0, the code, or -1 when it was killed by a signal.
func exitCode(p *childproc.Proc) int {
	var ee interface{ ExitCode() int }
	if errors.As(p.Err(), &ee) {
		return ee.ExitCode()
	}
	if p.Err() != nil {
		return -1
	}
	return 0
}

// apiClient is a client for the controller running now: its address and token are read on
// every call, so a restarted controller is found.
func (f *ferry) apiClient() (*api.Client, error) {
	info, err := f.home.ReadInfo()
	if err != nil {
		return nil, err
	}
	tok, err := os.ReadFile(f.home.TokenPath())
	if err != nil {
		return nil, err
	}
	return api.NewClient("http://"+info.Addr, strings.TrimSpace(string(tok))), nil
}

// status is the service as the controller reports it.
func (f *ferry) status(ctx context.Context) (api.ServiceStatus, error) {
	c, err := f.apiClient()
	if err != nil {
		return api.ServiceStatus{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	list, err := c.Services(ctx, serviceName)
	if err != nil {
		return api.ServiceStatus{}, err
	}
	if len(list) != 1 {
		return api.ServiceStatus{}, fmt.Errorf("status of %q: %d services in the answer", serviceName, len(list))
	}
	return list[0], nil
}

// endpointAddr is the host:port of a status endpoint URL.
func endpointAddr(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("service endpoint %q is not a URL", endpoint)
	}
	return u.Host, nil
}

// controllerPID is the pid of the controller running for this home: the one in
// controller.json, if that process is alive, not a zombie, and a ferry controller of this
// home (its command line names the home's log file). 0 when none runs.
func (f *ferry) controllerPID() (int, error) {
	info, err := f.home.ReadInfo()
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if !alive(info.PID) {
		return 0, nil
	}
	cmdline, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(info.PID), "cmdline"))
	if err != nil {
		return 0, nil // exited meanwhile
	}
	args := strings.Split(string(bytes.TrimRight(cmdline, "\x00")), "\x00")
	if len(args) < 2 || args[1] != "controller" || !strings.Contains(string(cmdline), f.home.Dir) {
		return 0, fmt.Errorf("controller.json names pid %d, which is not this home's controller (%q)", info.PID, strings.Join(args, " "))
	}
	return info.PID, nil
}

// alive reports whether pid is a live, non-zombie process.
func alive(pid int) bool {
	s, err := procstat.ReadStat(procRoot, pid)
	return err == nil && s.State != 'Z'
}

// killController SIGKILLs the controller and waits until it is gone. It returns the pid.
func (f *ferry) killController(ctx context.Context) (int, error) {
	pid, err := f.controllerPID()
	if err != nil {
		return 0, err
	}
	if pid == 0 {
		return 0, errors.New("no controller is running to kill")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return pid, fmt.Errorf("kill -9 %d: %w", pid, err)
	}
	err = pollUntil(ctx, 5*time.Second, 20*time.Millisecond, func() (bool, error) { return !alive(pid), nil })
	if err != nil {
		return pid, fmt.Errorf("controller %d still alive after SIGKILL: %w", pid, err)
	}
	return pid, nil
}

// pollUntil calls cond every interval until it returns true or an error, ctx ends, or
// timeout passes.
func pollUntil(ctx context.Context, timeout, interval time.Duration, cond func() (bool, error)) error {
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

// instance is the part of a local replica's instance.json the leak checks use.
type instance struct {
	ID     string            `json:"id"`
	Labels map[string]string `json:"labels"`
	PID    int               `json:"pid"`
	PGID   int               `json:"pgid"`
}

// version is the version the instance was launched as (its ferry.version label).
func (i instance) version() int {
	v, _ := strconv.Atoi(i.Labels["ferry.version"])
	return v
}

// scanInstances records every instance the local launcher has a directory for now.
func (f *ferry) scanInstances() {
	paths, _ := filepath.Glob(filepath.Join(f.home.LocalDir(), "*", "instance.json"))
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // terminated meanwhile
		}
		var in instance
		if json.Unmarshal(b, &in) != nil || in.ID == "" || in.PGID <= 1 {
			continue // being written
		}
		f.seen[in.ID] = in
	}
}

// liveInstances is every seen instance whose process group still has a live process, by id.
func (f *ferry) liveInstances() []instance {
	f.scanInstances()
	f.mu.Lock()
	seen := make([]instance, 0, len(f.seen))
	for _, in := range f.seen {
		seen = append(seen, in)
	}
	f.mu.Unlock()
	var live []instance
	for _, in := range seen {
		if members, err := procstat.GroupStats(procRoot, in.PGID); err == nil && len(members) > 0 {
			live = append(live, in)
		}
	}
	sort.Slice(live, func(i, j int) bool { return live[i].ID < live[j].ID })
	return live
}

// countByVersion counts instances per launched-as version.
func countByVersion(ins []instance) map[int]int {
	out := map[int]int{}
	for _, in := range ins {
		out[in.version()]++
	}
	return out
}
