// Package e2e drives the real ferry binary the way a user does: serve up from the README's
// quickstart, requests with curl-shaped HTTP and the official OpenAI Go SDK, replica and
// controller crashes, and serve down, all on loopback with real processes.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferryserve/ferry/internal/testcluster"
)

// Which tests run in parallel. Most of a test's time is spent waiting (replicas starting,
// probes, polls), so the independent ones call t.Parallel: each has its own FERRY_HOME from
// newEnv, its own controller, which binds no machine-wide default address
// (controllerListenersOff), its own ports (freePort) and fake clouds (nextEC2Subnet). Go runs
// every sequential test first, then the parallel ones, so the two kinds never overlap.
//
// Sequential (42 of 81), because they share something:
//   - the test cluster (internal/testcluster), 31 tests: every StartKubelet serves the
//     cluster's one kubelet port and runs the pods of every namespace; nodes, webhooks,
//     schedulers and CRDs are cluster-wide.
//   - a service's endpoint port across a controller restart, 8 tests (attach, both fixed-port,
//     TestMultiNodeReplicas, privnet, quickstart, TestStoreKeyWrongOrMissing,
//     TestDisaggregatedPoolsScaleApart): every
//     controller takes the lowest free port from 30001, so while this test's controller is
//     down another test's new service would take the port the restarted one restores.
//   - process-wide environment, 1 test: TestJobMountCheckpointResumesAfterPreemption
//     (t.Setenv, in fakefuse.Install too).
//   - a wall-clock bound of one second under load, 1 test:
//     TestControllerAPIOutlastsIdleConnections; with other tests using both cores the CLI
//     alone can take that long.
//   - scale timings it reports, 1 test: TestProxiesHPAScalesOnLoad, on a test cluster of its
//     own (with kube-controller-manager), whose HPA figures mean little with both cores busy.

// ferryBin is the ferry binary TestMain builds once for every test.
var ferryBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ferry-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ferryBin = filepath.Join(dir, "ferry")
	build := exec.Command("go", "build", "-o", ferryBin, "./cmd/ferry")
	build.Dir = repoRoot()
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build ferry:", err)
		os.Exit(1)
	}
	// The Kubernetes tests share one real test cluster, started on first use and stopped here.
	code := testcluster.Main(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// env is one isolated Ferry installation: its own FERRY_HOME and controller.
type env struct {
	t    *testing.T
	home string
	// extraEnv is added to every command's environment (and so the controller's).
	extraEnv []string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	// A short path: unix socket and log paths stay readable in failures.
	home, err := os.MkdirTemp("", "ferry-home-")
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, home: home}
	t.Cleanup(func() {
		// Tear everything down even when the test failed half-way, so no process outlives it.
		_, _, _ = e.run("serve", "down", "-a", "-y")
		e.stopJobs()
		_, _, _ = e.run("controller", "stop")
		if t.Failed() {
			if b, err := os.ReadFile(filepath.Join(home, "controller.log")); err == nil {
				t.Logf("controller.log:\n%s", lastLines(string(b), 60))
			}
		}
		os.RemoveAll(home)
	})
	return e
}

// controllerListenersOff keeps every controller a test starts off the machine-wide default
// gateway (127.0.0.1:30000) and metrics (127.0.0.1:9464) addresses, which only one controller at
// a time can hold: a parallel test would otherwise get another test's gateway or none. A test
// that wants either names a free address in extraEnv, which comes later and so wins.
var controllerListenersOff = []string{"FERRY_GATEWAY_ADDR=off", "FERRY_METRICS_ADDR=off"}

func (e *env) cmd(args ...string) *exec.Cmd {
	c := exec.Command(ferryBin, args...)
	c.Env = slices.Concat(os.Environ(), []string{"FERRY_HOME=" + e.home}, controllerListenersOff, e.extraEnv)
	c.Dir = repoRoot()
	return c
}

// run runs ferry with a deadline and returns stdout and stderr.
func (e *env) run(args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := e.cmd(args...)
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	if err := c.Start(); err != nil {
		return "", "", err
	}
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case err := <-done:
		return stdout.String(), stderr.String(), err
	case <-ctx.Done():
		_ = c.Process.Kill()
		<-done
		return stdout.String(), stderr.String(), fmt.Errorf("ferry %s: timed out", strings.Join(args, " "))
	}
}

func (e *env) mustRun(args ...string) string {
	e.t.Helper()
	out, errOut, err := e.run(args...)
	if err != nil {
		e.t.Fatalf("ferry %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

// eventually polls cond until it holds or the deadline passes; no test sleeps for a decision.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for time.Now().Before(deadline) {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: not within %s; last state: %s", what, timeout, last)
}

// controllerPID reads the running controller's pid from controller.json.
func (e *env) controllerPID() int {
	e.t.Helper()
	b, err := os.ReadFile(filepath.Join(e.home, "controller.json"))
	if err != nil {
		e.t.Fatalf("read controller.json: %v", err)
	}
	var info struct {
		PID int `json:"pid"`
	}
	if err := json.Unmarshal(b, &info); err != nil {
		e.t.Fatal(err)
	}
	return info.PID
}

func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// A zombie has exited; only its parent has not reaped it yet.
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

func listening(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
