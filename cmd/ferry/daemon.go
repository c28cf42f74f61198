package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/internal/home"
	"github.com/ferryserve/ferry/internal/infra"
	"github.com/ferryserve/ferry/launcher/local"
)

// connect returns a client for a live controller, or nil when none answers.
func connect(ctx context.Context, h home.Home) (*api.Client, api.ControllerStatus, error) {
	info, err := h.ReadInfo()
	if err != nil {
		return nil, api.ControllerStatus{}, err
	}
	tok, err := h.Token()
	if err != nil {
		return nil, api.ControllerStatus{}, err
	}
	c, err := api.ClientFor(h, info, tok)
	if err != nil {
		return nil, api.ControllerStatus{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	st, err := c.ControllerStatus(ctx)
	if err != nil {
		return nil, st, err
	}
	return c, st, nil
}

// ensureController returns a client for this home's controller, starting the daemon in the
// background first if none answers — a user never has to start it by hand.
func ensureController(ctx context.Context, h home.Home, progress io.Writer) (*api.Client, error) {
	if c, _, err := connect(ctx, h); err == nil {
		return c, nil
	}
	if err := h.Ensure(); err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(h.ControllerLog(), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	logStart, _ := logf.Seek(0, io.SeekEnd)
	cmd := exec.Command(self, "controller", "--log-file", h.ControllerLog())
	cmd.Env = daemonEnv(os.Environ(), h)
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.Dir = "/"
	// Its own session: the daemon outlives this CLI and the user's terminal.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start controller: %w", err)
	}
	pid := cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	fmt.Fprintf(progress, "⚙︎ Started the controller (pid %d, log %s)\n", pid, h.ControllerLog())
	deadline := time.Now().Add(api.WaitTimeout)
	for time.Now().Before(deadline) {
		if c, _, err := connect(ctx, h); err == nil {
			return c, nil
		}
		select {
		case err := <-exited:
			// Another CLI may have started one at the same moment; it holds the lock.
			if c, _, cerr := connect(ctx, h); cerr == nil {
				return c, nil
			}
			return nil, fmt.Errorf("controller exited at start (%v)%s; see %s", err, startFailure(h.ControllerLog(), logStart), h.ControllerLog())
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil, fmt.Errorf("controller did not answer within %s; see %s", api.WaitTimeout, h.ControllerLog())
}

// startFailure is the error a controller that exited at start wrote last (its "ferry: ..."
// line) in its log from offset on, as ": <error>", or "" when there is none: a store it cannot
// open (say, with the wrong key) is then said where the user looks.
func startFailure(log string, offset int64) string {
	f, err := os.Open(log)
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return ""
	}
	data, _ := io.ReadAll(io.LimitReader(f, 1<<20))
	last := ""
	for _, line := range strings.Split(string(data), "\n") {
		if msg, ok := strings.CutPrefix(line, "ferry: "); ok {
			last = msg
		}
	}
	if last == "" {
		return ""
	}
	return ": " + last
}

// daemonEnv is the environment of a controller the CLI starts: of the CLI's own (environ),
// only what the controller needs, and FERRY_HOME. The daemon outlives the command that
// started it and launches every later replica of every service, so a secret in the user's
// shell (a key passed as `CHAT_KEY=... ferry serve up` for keys_from_env, a token exported long
// ago) must not live on in it. What it keeps: its own FERRY_ settings, the cloud and cluster
// credentials its infras read (infra.CredentialEnv), what local replicas inherit
// (local.BaseEnv: PATH, HOME, locale, TMPDIR, GPUs), the proxy and CA settings of its own
// HTTPS clients, and the Go runtime's knobs.
func daemonEnv(environ []string, h home.Home) []string {
	var env []string
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		if k != home.Env && daemonNeeds(k) {
			env = append(env, kv)
		}
	}
	return append(env, home.Env+"="+h.Dir)
}

// daemonRuntimeEnv are the variables of the daemon's own runtime that daemonEnv keeps.
var daemonRuntimeEnv = []string{
	"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
	"GODEBUG", "GOGC", "GOMEMLIMIT", "GOMAXPROCS", "GOTRACEBACK", "GORACE", "GOCOVERDIR",
}

func daemonNeeds(name string) bool {
	return strings.HasPrefix(name, "FERRY_") || infra.CredentialEnv(name) || local.BaseEnv(name) ||
		slices.Contains(daemonRuntimeEnv, name)
}

// binDir is the directory of the running ferry binary, put first on local replicas' PATH so
// that `run: ferry replica-sim` finds this very binary.
func binDir() []string {
	self, err := os.Executable()
	if err != nil {
		return nil
	}
	if resolved, err := filepath.EvalSymlinks(self); err == nil {
		self = resolved
	}
	return []string{filepath.Dir(self)}
}
