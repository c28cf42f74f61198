package local

import (
	"context"
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
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/privnet"
)

// helperLaunchEnv makes the test binary act as a short-lived controller: it launches one
// instance in the given Dir, prints its id and exits without terminating it, so that the
// instance's process is no longer a child of whoever adopts it.
const helperLaunchEnv = "FERRY_LOCAL_TEST_LAUNCH_DIR"

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == SuperviseCommand {
		os.Exit(Supervise(os.Args[2:])) // the test binary stands in for `ferry local-supervise`
	}
	if len(os.Args) > 1 && os.Args[1] == privnet.HelperCommand {
		if os.Getenv(netnsFailEnv) != "" { // supervise_privnet_linux_test.go
			_, _ = os.NewFile(3, "ready").WriteString("no user namespaces here")
			os.Exit(1)
		}
		os.Exit(privnet.Serve(os.Args[2:])) // and for `ferry local-netns`
	}
	if len(os.Args) > 1 && os.Args[1] == denySeccompCommand {
		denySeccompThenExec(os.Args[2:]) // supervise_linux_test.go
	}
	if dir := os.Getenv(helperLaunchEnv); dir != "" {
		p, err := New(Options{Dir: dir})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		inst, err := p.Launch(context.Background(), launcher.Spec{
			Name:   "orphan",
			Labels: map[string]string{launcher.LabelService: "adopt"},
			Run:    "echo started; sleep 300",
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		fmt.Println(inst.ID)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func newProvider(t *testing.T, opts Options) *Provider {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	if opts.WorkRoot == "" {
		opts.WorkRoot = t.TempDir() // replicas a test leaves to exit leave their directories
	}
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return string(b)
}

// processGone reports whether pid has exited (a zombie counts: it runs nothing).
func processGone(pid int) bool {
	st, err := readProcStat(pid)
	return err != nil || st.State == 'Z'
}

func listOne(t *testing.T, p *Provider, selector map[string]string) launcher.Instance {
	t.Helper()
	got, err := p.List(context.Background(), selector)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("List(%v) = %d instances, want 1: %+v", selector, len(got), got)
	}
	return got[0]
}

func TestLaunchListTerminate(t *testing.T) {
	p := newProvider(t, Options{})
	ctx := context.Background()
	labels := map[string]string{launcher.LabelService: "chat", launcher.LabelReplicaID: "3"}
	inst, err := p.Launch(ctx, launcher.Spec{
		Name:   "chat-3",
		Labels: labels,
		Envs:   map[string]string{"FERRY_SERVICE": "chat", "API_KEY": "s3cret-value", "FERRY_PORT": "1"},
		Run:    `echo "port=$FERRY_PORT host=$FERRY_HOST service=$FERRY_SERVICE key=$API_KEY"; sleep 300`,
		Port:   8080,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(inst.ID, "local-chat-3-") || len(inst.ID) != len("local-chat-3-")+6 {
		t.Errorf("ID = %q, want local-chat-3-<6 hex>", inst.ID)
	}
	host, port, err := net.SplitHostPort(inst.Endpoint)
	if err != nil || host != DefaultHost || port == "8080" || port == "0" {
		t.Errorf("Endpoint = %q, want %s:<fresh port>", inst.Endpoint, DefaultHost)
	}
	want := launcher.Instance{ID: inst.ID, Name: "chat-3", Labels: labels, Endpoint: inst.Endpoint,
		Infra: "local", State: launcher.StateRunning, LaunchedAt: inst.LaunchedAt, IP: DefaultHost}
	if diff := cmp.Diff(want, inst); diff != "" {
		t.Errorf("Launch() mismatch (-want +got):\n%s", diff)
	}

	logPath, err := p.LogPath(inst.ID)
	if err != nil {
		t.Fatal(err)
	}
	wantLine := fmt.Sprintf("port=%s host=127.0.0.1 service=chat key=s3cret-value", port)
	waitFor(t, 5*time.Second, "replica output", func() bool { return strings.Contains(readFile(t, logPath), wantLine) })

	got := listOne(t, p, map[string]string{launcher.LabelService: "chat"})
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("List() mismatch (-want +got):\n%s", diff)
	}
	if other, err := p.List(ctx, map[string]string{launcher.LabelService: "other"}); err != nil || len(other) != 0 {
		t.Errorf("List(other) = %v, %v; want none", other, err)
	}

	// Secrets reach the process through its environment, never the disk.
	dir := filepath.Join(p.opts.Dir, inst.ID)
	for _, f := range []string{metadataFile, scriptFile} {
		if strings.Contains(readFile(t, filepath.Join(dir, f)), "s3cret") {
			t.Errorf("%s holds a secret value", f)
		}
	}
	for path, wantMode := range map[string]os.FileMode{
		dir: 0o700 | os.ModeDir, logPath: 0o600, filepath.Join(dir, metadataFile): 0o600, filepath.Join(dir, scriptFile): 0o600,
	} {
		if fi, err := os.Stat(path); err != nil || fi.Mode() != wantMode {
			t.Errorf("mode of %s = %v (%v), want %v", path, fi.Mode(), err, wantMode)
		}
	}

	meta, err := loadMetadata(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Terminate(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
	if !processGone(meta.PID) {
		t.Errorf("process %d still running after Terminate", meta.PID)
	}
	if all, err := p.List(ctx, nil); err != nil || len(all) != 0 {
		t.Errorf("List after Terminate = %v, %v; want none", all, err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("instance dir still exists: %v", err)
	}
	kept, err := p.LogPath(inst.ID)
	if err != nil {
		t.Fatal(err)
	}
	if kept != filepath.Join(p.opts.Dir, "logs", "chat-3.log") || !strings.Contains(readFile(t, kept), wantLine) {
		t.Errorf("kept log %s does not hold the replica's output", kept)
	}
	if err := p.Terminate(ctx, inst.ID); err != nil {
		t.Errorf("second Terminate = %v, want nil", err)
	}
}

func TestTerminateKillsWholeGroup(t *testing.T) {
	p := newProvider(t, Options{StopGrace: 300 * time.Millisecond})
	pidFile := filepath.Join(t.TempDir(), "pids")
	inst, err := p.Launch(context.Background(), launcher.Spec{
		Name: "group",
		Envs: map[string]string{"PIDFILE": pidFile},
		// A background grandchild, a grandchild of a subshell that is gone, and one that
		// ignores SIGTERM so that only SIGKILL stops it.
		Run: `sleep 300 & echo $! >> "$PIDFILE"
( sleep 301 & echo $! >> "$PIDFILE" )
bash -c 'trap "" TERM; echo $$ >> "$PIDFILE"; while :; do sleep 0.05; done' &
wait`,
	})
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	waitFor(t, 5*time.Second, "three grandchildren", func() bool {
		pids = pids[:0]
		for _, f := range strings.Fields(readFile(t, pidFile)) {
			pid, err := strconv.Atoi(f)
			if err != nil {
				t.Fatal(err)
			}
			pids = append(pids, pid)
		}
		return len(pids) == 3
	})
	meta, err := loadMetadata(filepath.Join(p.opts.Dir, inst.ID))
	if err != nil {
		t.Fatal(err)
	}
	pids = append(pids, meta.PID)
	for _, pid := range pids {
		if processGone(pid) {
			t.Fatalf("process %d not running before Terminate", pid)
		}
	}
	start := time.Now()
	if err := p.Terminate(context.Background(), inst.ID); err != nil {
		t.Fatal(err)
	}
	if elapsed := time.Since(start); elapsed < 300*time.Millisecond {
		t.Errorf("Terminate took %v; the TERM-ignoring process should have forced the %v grace", elapsed, 300*time.Millisecond)
	}
	for _, pid := range pids {
		if !processGone(pid) {
			t.Errorf("process %d survived Terminate", pid)
		}
	}
}

func TestExitReasonRecorded(t *testing.T) {
	tests := map[string]struct {
		run        string
		wantReason string
	}{
		"exit code":       {run: "echo bye; exit 3", wantReason: "exit status 3"},
		"killed":          {run: "kill -KILL $$", wantReason: "signal: killed"},
		"setup fails":     {run: "echo should-not-run", wantReason: "exit status 1"},
		"missing command": {run: "no-such-command-ferry", wantReason: "exit status 127"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := newProvider(t, Options{})
			spec := launcher.Spec{Name: "r", Labels: map[string]string{"k": name}, Run: tc.run}
			if name == "setup fails" {
				spec.Setup = "false\necho after-false"
			}
			inst, err := p.Launch(context.Background(), spec)
			if err != nil {
				t.Fatal(err)
			}
			var got launcher.Instance
			waitFor(t, 5*time.Second, "instance to end", func() bool {
				got = listOne(t, p, nil)
				return got.State == launcher.StateTerminated
			})
			if got.Reason != tc.wantReason {
				t.Errorf("Reason = %q, want %q", got.Reason, tc.wantReason)
			}
			// A fresh Provider (a restarted controller) reads the same reason from disk.
			again := listOne(t, newProvider(t, Options{Dir: p.opts.Dir}), nil)
			if again.State != launcher.StateTerminated || again.Reason != tc.wantReason {
				t.Errorf("after restart: %s %q, want TERMINATED %q", again.State, again.Reason, tc.wantReason)
			}
			if name == "setup fails" {
				if out := readFile(t, filepath.Join(p.opts.Dir, inst.ID, logFile)); strings.Contains(out, "should-not-run") || strings.Contains(out, "after-false") {
					t.Errorf("commands ran after a failing setup step: %q", out)
				}
			}
			if err := p.Terminate(context.Background(), inst.ID); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestWorkdirSetupAndPath(t *testing.T) {
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "hello-ferry"), []byte("#!/bin/sh\necho hello-from-path\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	if err := os.WriteFile(filepath.Join(work, "in-workdir.txt"), []byte("synced"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, Options{PathPrepend: []string{bin}})
	inst, err := p.Launch(context.Background(), launcher.Spec{
		Name:    "wd",
		Workdir: work,
		Setup:   "export FROM_SETUP=yes",
		Run:     `hello-ferry; echo "pwd=$(pwd) setup=$FROM_SETUP"; cat in-workdir.txt; echo; touch made-by-run`,
	})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "instance to end", func() bool { return listOne(t, p, nil).State == launcher.StateTerminated })
	if got := listOne(t, p, nil).Reason; got != "exit status 0" {
		t.Errorf("Reason = %q, want exit status 0", got)
	}
	out := readFile(t, filepath.Join(p.opts.Dir, inst.ID, logFile))
	// The run starts in a copy of the workdir, as SkyPilot's does in ~/sky_workdir: what it
	// writes there never reaches the user's directory.
	for _, want := range []string{"hello-from-path", "pwd=" + p.opts.WorkRoot + "/" + workDirPrefix, " setup=yes", "\nsynced\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("output %q lacks %q", out, want)
		}
	}
	if _, err := os.Stat(filepath.Join(work, "made-by-run")); !os.IsNotExist(err) {
		t.Errorf("the run wrote into the user's workdir (stat: %v)", err)
	}
}

// TestAdoptOrphan launches from another process that then exits, as a crashed controller
// would, and checks that a new Provider on the same Dir sees and stops the replica.
func TestAdoptOrphan(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperLaunchEnv+"="+dir)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper controller: %v", err)
	}
	id := strings.TrimSpace(string(out))

	p := newProvider(t, Options{Dir: dir, StopGrace: 2 * time.Second})
	got := listOne(t, p, map[string]string{launcher.LabelService: "adopt"})
	if got.ID != id || got.State != launcher.StateRunning {
		t.Fatalf("adopted instance = %s %s, want %s RUNNING", got.ID, got.State, id)
	}
	meta, err := loadMetadata(filepath.Join(dir, id))
	if err != nil {
		t.Fatal(err)
	}
	logPath, err := p.LogPath(id)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "orphan output", func() bool { return strings.Contains(readFile(t, logPath), "started") })
	if err := p.Terminate(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if !processGone(meta.PID) {
		t.Errorf("orphan %d still running", meta.PID)
	}
	if all, _ := p.List(context.Background(), nil); len(all) != 0 {
		t.Errorf("List after Terminate = %+v", all)
	}
}

// TestAdoptOwnChildAfterProviderDiscarded covers a new Provider in the same process: it cannot
// Wait for the process, and must still see it live, then gone.
func TestAdoptOwnChildAfterProviderDiscarded(t *testing.T) {
	first := newProvider(t, Options{})
	inst, err := first.Launch(context.Background(), launcher.Spec{Name: "kept", Run: "sleep 300"})
	if err != nil {
		t.Fatal(err)
	}
	second := newProvider(t, Options{Dir: first.opts.Dir})
	if got := listOne(t, second, nil); got.ID != inst.ID || got.State != launcher.StateRunning {
		t.Fatalf("second provider sees %s %s, want %s RUNNING", got.ID, got.State, inst.ID)
	}
	if err := second.Terminate(context.Background(), inst.ID); err != nil {
		t.Fatal(err)
	}
	if all, _ := first.List(context.Background(), nil); len(all) != 0 {
		t.Errorf("first provider still lists %+v", all)
	}
}

// TestPIDReuseGuard fakes metadata whose pid is alive (this test process) but whose start time
// is not: the instance must read as terminated and Terminate must not signal that pid's group,
// which would kill the test.
func TestPIDReuseGuard(t *testing.T) {
	p := newProvider(t, Options{StopGrace: 100 * time.Millisecond})
	self, err := readProcStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	id := "local-fake-abcdef"
	dir := filepath.Join(p.opts.Dir, id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	meta := &metadata{ID: id, Name: "fake", PID: os.Getpid(), PGID: os.Getpid(), StartTime: self.StartTime + 1,
		Endpoint: "127.0.0.1:1", Labels: map[string]string{"x": "y"}}
	if err := saveMetadata(dir, meta); err != nil {
		t.Fatal(err)
	}
	got := listOne(t, p, map[string]string{"x": "y"})
	if got.State != launcher.StateTerminated || !strings.Contains(got.Reason, "pid reused") {
		t.Errorf("got %s %q, want TERMINATED with a pid-reuse reason", got.State, got.Reason)
	}
	if err := p.Terminate(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("fake instance dir not removed: %v", err)
	}
}

func TestConcurrentLaunchAndTerminate(t *testing.T) {
	p := newProvider(t, Options{StopGrace: time.Second})
	const n = 6
	insts := make([]launcher.Instance, n)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			insts[i], errs[i] = p.Launch(context.Background(), launcher.Spec{
				Name: fmt.Sprintf("c-%d", i), Labels: map[string]string{"svc": "c"}, Run: "sleep 300",
			})
		})
	}
	wg.Wait()
	ports := map[string]bool{}
	for i := range n {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		ports[insts[i].Endpoint] = true
	}
	if len(ports) != n {
		t.Errorf("%d distinct endpoints for %d instances", len(ports), n)
	}
	all, err := p.List(context.Background(), map[string]string{"svc": "c"})
	if err != nil || len(all) != n {
		t.Fatalf("List = %d, %v; want %d", len(all), err, n)
	}
	for i := range n {
		wg.Go(func() { errs[i] = p.Terminate(context.Background(), insts[i].ID) })
		wg.Go(func() { _, _ = p.List(context.Background(), nil) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if all, _ := p.List(context.Background(), nil); len(all) != 0 {
		t.Errorf("List after Terminate = %d instances", len(all))
	}
}

func TestInvalidRequests(t *testing.T) {
	p := newProvider(t, Options{})
	ctx := context.Background()
	for name, spec := range map[string]launcher.Spec{
		"empty name": {Run: "true"},
		"slash":      {Name: "a/b", Run: "true"},
		"dot":        {Name: ".hidden", Run: "true"},
		"empty run":  {Name: "ok", Run: "  "},
	} {
		if _, err := p.Launch(ctx, spec); !errors.Is(err, launcher.ErrInvalid) {
			t.Errorf("%s: Launch error = %v, want ErrInvalid", name, err)
		}
	}
	for _, id := range []string{"../x", "..", "a/b", ""} {
		if err := p.Terminate(ctx, id); !errors.Is(err, launcher.ErrInvalid) {
			t.Errorf("Terminate(%q) = %v, want ErrInvalid", id, err)
		}
	}
	if err := p.Terminate(ctx, "local-nothing-000000"); err != nil {
		t.Errorf("Terminate(unknown) = %v, want nil", err)
	}
	if _, err := p.LogPath("local-nothing-000000"); !errors.Is(err, launcher.ErrNotFound) {
		t.Errorf("LogPath(unknown) = %v, want ErrNotFound", err)
	}
	if _, err := New(Options{}); err == nil {
		t.Error("New without Dir succeeded")
	}
}

func TestParseProcStat(t *testing.T) {
	tests := map[string]struct {
		line    string
		want    procStat
		wantErr bool
	}{
		"plain": {
			line: "1234 (sleep) S 1 1234 1234 0 -1 4194304 100 0 0 0 0 0 0 0 20 0 1 0 987654 8000000 200 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0",
			want: procStat{State: 'S', Pgrp: 1234, StartTime: 987654},
		},
		"name with spaces and parens": {
			line: "77 (a) b (c) Z 1 70 70 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 42 0 0",
			want: procStat{State: 'Z', Pgrp: 70, StartTime: 42},
		},
		"truncated": {line: "77 (a) S 1 70", wantErr: true},
		"no parens": {line: "garbage", wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := parseProcStat(tc.line)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNameFromID(t *testing.T) {
	for id, want := range map[string]string{"local-chat-3-a1b2c3": "chat-3", "local-x-000000": "x", "bogus": ""} {
		if got, _ := nameFromID(id); got != want {
			t.Errorf("nameFromID(%q) = %q, want %q", id, got, want)
		}
	}
}

// TestTerminateKillsWhatLeftTheGroup: a process that left the instance's process group
// (setsid, as a daemon does) is stopped with the instance: it carries the instance's marker.
func TestTerminateKillsWhatLeftTheGroup(t *testing.T) {
	p := newProvider(t, Options{StopGrace: 300 * time.Millisecond})
	pidFile := filepath.Join(t.TempDir(), "pids")
	inst, err := p.Launch(context.Background(), launcher.Spec{
		Name: "daemon",
		Envs: map[string]string{"PIDFILE": pidFile},
		Run:  `setsid bash -c 'echo $$ >> "$PIDFILE"; exec sleep 303' & wait`,
	})
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	waitFor(t, 5*time.Second, "the daemon", func() bool {
		pid, _ = strconv.Atoi(strings.TrimSpace(readFile(t, pidFile)))
		return pid > 0
	})
	meta, err := loadMetadata(filepath.Join(p.opts.Dir, inst.ID))
	if err != nil {
		t.Fatal(err)
	}
	if st, err := readProcStat(pid); err != nil || st.Pgrp == meta.PGID {
		t.Fatalf("the daemon (pid %d, %+v, %v) did not leave the instance's group %d", pid, st, err, meta.PGID)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	if err := p.Terminate(context.Background(), inst.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the daemon gone", func() bool { return processGone(pid) })
}
