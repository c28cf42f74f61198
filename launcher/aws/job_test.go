package aws

import (
	"bytes"
	"context"
	"errors"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/aws/fakeec2"
)

// jobSpecFor is a job node's spec: a service replica's without service labels, with a JobSpec.
func jobSpecFor(name, setup, run string, spot bool) launcher.Spec {
	s := spec(name, run, spot)
	s.Labels = map[string]string{launcher.LabelJob: "7", launcher.LabelAttempt: "1"}
	s.Setup = setup
	s.Job = &launcher.JobSpec{Priority: launcher.DefaultJobPriority, Grace: 10 * time.Second, CheckpointDir: "/ferry/checkpoints/7"}
	return s
}

// listed is the instance id as List reports it now.
func listed(t *testing.T, p *Provider, id string) launcher.Instance {
	t.Helper()
	insts, err := p.List(context.Background(), map[string]string{launcher.LabelJob: "7"})
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range insts {
		if in.ID == id {
			return in
		}
	}
	return launcher.Instance{ID: id, State: "GONE"}
}

// waitExited waits until List reports the node ended by itself and returns its exit status.
func waitExited(t *testing.T, p *Provider, id string) int {
	t.Helper()
	var in launcher.Instance
	waitFor(t, testTimeout, id+" to exit", func() (bool, string) {
		in = listed(t, p, id)
		return in.ExitCode != nil, string(in.State) + " " + in.Reason
	})
	if in.State != launcher.StateTerminated {
		t.Fatalf("%s exited with %d but is %s", id, *in.ExitCode, in.State)
	}
	return *in.ExitCode
}

// TestJobGangTalksOverTCP: a 2-node job gang lands in one zone and one cluster placement group;
// each node learns the gang's private IPs, rank 0 first, from its instance metadata service
// (the ferry-node-ips tag, IMDSv2); rank 1 dials rank 0 on its IP from its own; both exit 0,
// which List reports as ExitCode 0 once the VMs have powered off.
func TestJobGangTalksOverTCP(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	s := jobSpecFor("train", `echo "setup on rank $SKYPILOT_SETUP_NODE_RANK"`, `exec "$TEST_BIN"`, false)
	s.Envs = map[string]string{"TEST_BIN": self, envGangNode: "1"}
	insts, err := launcher.LaunchGang(context.Background(), e.p, s, 2)
	if err != nil {
		t.Fatal(err)
	}
	var ips []string
	for _, in := range insts {
		fi := fakeInstance(t, e.fake, in.ID)
		if in.IP == "" || in.IP != fi.PrivateIP || fi.ZoneID != testZoneID || fi.PlacementGroup == "" || fi.PlacementGroup != fakeInstance(t, e.fake, insts[0].ID).PlacementGroup {
			t.Fatalf("node %s: ip %q, fake %+v: want its private IP, in %s, in the gang's placement group", in.Name, in.IP, fi, testZoneID)
		}
		if fi.Metadata.InstanceMetadataTags != "enabled" || fi.Metadata.HTTPTokens != "required" || fi.Metadata.HopLimit != 1 {
			t.Fatalf("node %s metadata options %+v: want tags in metadata, IMDSv2 required, hop limit 1", in.Name, fi.Metadata)
		}
		ips = append(ips, in.IP)
	}
	// On EC2 the ranks reach each other only through a rule (the fake does not filter).
	rules := e.fake.IngressRules(testRegion, DefaultJobSecurityGroup)
	if len(rules) != 1 || rules[0].Protocol != "-1" || rules[0].GroupID == "" {
		t.Fatalf("job security group rules %+v, want all traffic from the group itself", rules)
	}
	for _, in := range insts {
		if rc := waitExited(t, e.p, in.ID); rc != 0 {
			t.Fatalf("%s exited %d; console:\n%s", in.Name, rc, e.fake.ConsoleOutput(fakeInstance(t, e.fake, in.ID).ID))
		}
	}
	rank0 := e.fake.ConsoleOutput(fakeInstance(t, e.fake, insts[0].ID).ID)
	rank1 := e.fake.ConsoleOutput(fakeInstance(t, e.fake, insts[1].ID).ID)
	for _, want := range []string{"setup on rank 0", "node ips [" + ips[0] + " " + ips[1] + "]", `rank 0 heard "hello from rank 1" from ` + ips[1], exitMarker + "0"} {
		if !strings.Contains(rank0, want) {
			t.Errorf("rank 0's console lacks %q:\n%s", want, rank0)
		}
	}
	if want := `rank 1 got "welcome" from rank 0 at ` + ips[0]; !strings.Contains(rank1, want) {
		t.Errorf("rank 1's console lacks %q:\n%s", want, rank1)
	}
	for _, in := range insts {
		fi := fakeInstance(t, e.fake, in.ID)
		if fi.StateReason != fakeec2.ReasonInstanceInitiatedShutdown {
			t.Errorf("%s: state reason %q, want %s (the VM powered off)", in.Name, fi.StateReason, fakeec2.ReasonInstanceInitiatedShutdown)
		}
	}
}

// TestJobExitCodes: a node launched alone reports its run's exit status, a setup failure
// launcher.ExitSetupFailed, and a node still running none.
func TestJobExitCodes(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	ctx := context.Background()
	for name, tc := range map[string]struct {
		setup, run string
		want       int
	}{
		"success":      {run: `test "$SKYPILOT_NODE_IPS" = "$FERRY_HOST" && test -d "$FERRY_CHECKPOINT_DIR"`, want: 0},
		"run fails":    {run: "exit 3", want: 3},
		"setup fails":  {setup: "echo preparing; false", run: "echo never", want: launcher.ExitSetupFailed},
		"killed by -9": {run: "kill -9 $$", want: 137},
	} {
		t.Run(name, func(t *testing.T) {
			in, err := e.p.Launch(ctx, jobSpecFor("exit-"+strings.ReplaceAll(name, " ", "-"), tc.setup, tc.run, false))
			if err != nil {
				t.Fatal(err)
			}
			if got := waitExited(t, e.p, in.ID); got != tc.want {
				t.Fatalf("exit code %d, want %d; console:\n%s", got, tc.want, e.fake.ConsoleOutput(fakeInstance(t, e.fake, in.ID).ID))
			}
		})
	}
	running, err := e.p.Launch(ctx, jobSpecFor("long", "", "exec sleep 300", false))
	if err != nil {
		t.Fatal(err)
	}
	if in := listed(t, e.p, running.ID); in.State != launcher.StateRunning || in.ExitCode != nil {
		t.Fatalf("running node: %s, exit code %v; want running without one", in.State, in.ExitCode)
	}
	if err := e.p.Terminate(ctx, running.ID); err != nil {
		t.Fatal(err)
	}
	if in := listed(t, e.p, running.ID); in.ExitCode != nil {
		t.Fatalf("terminated node has exit code %d, want none", *in.ExitCode)
	}
}

// TestJobLogs: StreamLogs writes the console's last lines, and with Follow what the node prints
// later, until it has ended.
func TestJobLogs(t *testing.T) {
	fe := newEnv(t, fakeec2.Options{}, goodKey)
	p, err := New(context.Background(), Options{
		Regions: []string{testRegion}, Endpoint: fe.fake.URL(), Credentials: fe.p.opts.Credentials,
		AMIs: fe.p.opts.AMIs, LaunchTimeout: testTimeout, PollInterval: 10 * time.Millisecond, LogInterval: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	in, err := p.Launch(ctx, jobSpecFor("logs", "", `for i in 1 2 3 4; do echo "line $i"; done
while [ ! -e "$FERRY_STATE_DIR/go" ]; do sleep 0.05; done
echo "line 5"; exit 4`, false))
	if err != nil {
		t.Fatal(err)
	}
	fi := fakeInstance(t, fe.fake, in.ID)
	waitFor(t, testTimeout, "line 4", func() (bool, string) {
		out := fe.fake.ConsoleOutput(fi.ID)
		return strings.Contains(out, "line 4\n"), out
	})
	var last bytes.Buffer
	if err := p.StreamLogs(ctx, in.ID, launcher.LogOptions{Tail: 2}, &last); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff("line 3\nline 4\n", last.String()); d != "" {
		t.Fatalf("tail 2 (-want +got):\n%s", d)
	}
	var followed bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- p.StreamLogs(ctx, in.ID, launcher.LogOptions{Tail: -1, Follow: true}, &followed) }()
	stateDir := fi.LogPath[:len(fi.LogPath)-len(".log")] + ".d"
	if err := os.WriteFile(stateDir+"/go", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?s)line 1\n.*line 4\n.*line 5\n.*` + exitMarker + `4\n`).MatchString(followed.String()) {
		t.Fatalf("followed logs lack lines 1-5 and the exit status:\n%s", followed.String())
	}
}

// TestJobSpotInterruptionWarning: EC2's interruption warning reaches the program as SIGTERM,
// with the time left in the preemption file, while the VM still runs; the node then reports
// no exit status and, once reclaimed, is PREEMPTED.
func TestJobSpotInterruptionWarning(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	ctx := context.Background()
	in, err := e.p.Launch(ctx, jobSpecFor("spot", "", `trap 'echo "SIGTERM with $(cat "$FERRY_PREEMPTION_FILE")"; echo saved > "$FERRY_CHECKPOINT_DIR/step"; exit 0' TERM
echo training
while :; do sleep 0.1; done`, true))
	if err != nil {
		t.Fatal(err)
	}
	fi := fakeInstance(t, e.fake, in.ID)
	waitFor(t, testTimeout, "training", func() (bool, string) {
		out := e.fake.ConsoleOutput(fi.ID)
		return strings.Contains(out, "training"), out
	})
	if err := e.fake.PreemptWithNotice(fi.ID, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`SIGTERM with ` + launcher.EnvPreemptionGrace + `=(\d+)`)
	var out string
	waitFor(t, testTimeout, "SIGTERM with the time left", func() (bool, string) {
		out = e.fake.ConsoleOutput(fi.ID)
		return re.MatchString(out), out
	})
	left, _ := strconv.Atoi(re.FindStringSubmatch(out)[1])
	if left < 60 || left > 90 {
		t.Fatalf("%d s left at the warning, want 60-90 (a 90 s notice, polled every %d s)", left, preemptionPoll)
	}
	if got := listed(t, e.p, in.ID); got.State != launcher.StateRunning {
		t.Fatalf("node is %s after the warning, want still running until reclaimed", got.State)
	}
	if err := e.fake.Preempt(fi.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, testTimeout, "preempted", func() (bool, string) {
		got := listed(t, e.p, in.ID)
		return got.State == launcher.StatePreempted, string(got.State)
	})
	if got := listed(t, e.p, in.ID); got.ExitCode != nil {
		t.Fatalf("preempted node has exit code %d, want none", *got.ExitCode)
	}
	if strings.Contains(e.fake.ConsoleOutput(fi.ID), exitMarker) {
		t.Fatalf("a warned node marked an exit status:\n%s", e.fake.ConsoleOutput(fi.ID))
	}
}

// TestJobGangNoCapacity: a job's gang that does not fit in the zone fails with ErrNoCapacity
// and leaves no node running.
func TestJobGangNoCapacity(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	e.fake.SetCapacity(testZoneID, testType, 1)
	_, err := e.p.LaunchGang(context.Background(), jobSpecFor("big", "", "exec sleep 300", false), 2)
	if !errors.Is(err, launcher.ErrNoCapacity) {
		t.Fatalf("gang beyond capacity: %v, want ErrNoCapacity", err)
	}
	for _, in := range e.fake.Instances() {
		if in.State == "pending" || in.State == "running" {
			t.Fatalf("node %s of a failed gang is %s", in.ID, in.State)
		}
	}
	if insts, err := e.p.List(context.Background(), map[string]string{launcher.LabelJob: "7"}); err != nil || len(insts) != 0 {
		t.Fatalf("List after a failed gang: %v, %v; want nothing", insts, err)
	}
}

func TestParseExitStatus(t *testing.T) {
	for name, tc := range map[string]struct {
		console string
		want    int
		wantOK  bool
	}{
		"none":            {console: "hello\n", wantOK: false},
		"plain":           {console: "x\n" + exitMarker + "0\n", want: 0, wantOK: true},
		"console prefix":  {console: "[  12.3] cloud-init[99]: " + exitMarker + "42\r\n", want: 42, wantOK: true},
		"last one counts": {console: exitMarker + "1\nmore\n" + exitMarker + "2\n", want: 2, wantOK: true},
		"mid-line":        {console: "echo " + exitMarker + "5 and more\n", wantOK: false},
	} {
		t.Run(name, func(t *testing.T) {
			got, ok := parseExitStatus(tc.console)
			if ok != tc.wantOK || got != tc.want {
				t.Fatalf("parseExitStatus = %d, %v; want %d, %v", got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

func TestConsoleWindows(t *testing.T) {
	for name, tc := range map[string]struct {
		prev, next, want string
	}{
		"grew":      {prev: "a\nb\n", next: "a\nb\nc\n", want: "c\n"},
		"scrolled":  {prev: "a\nb\n", next: "b\nc\n", want: "c\n"},
		"unchanged": {prev: "a\n", next: "a\n", want: ""},
		"lost":      {prev: "a\n", next: "x\ny\n", want: "x\ny\n"},
	} {
		t.Run(name, func(t *testing.T) {
			if got := newOutput(tc.prev, tc.next); got != tc.want {
				t.Fatalf("newOutput = %q, want %q", got, tc.want)
			}
		})
	}
	for n, want := range map[int]string{-1: "1\n2\n3\n", 0: "", 2: "2\n3\n", 5: "1\n2\n3\n"} {
		if got := tail("1\n2\n3\n", n); got != want {
			t.Errorf("tail(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestJobCheckpointOnSharedFilesystem: with checkpoint_nfs, a job's checkpoint is its claim's
// directory on the region's shared filesystem (the fake's stand-in for an EFS mount), so a node
// launched later in another zone of the region, as a recovery is, finds what the first one
// saved; without it the directory is the VM's own and the node says so.
func TestJobCheckpointOnSharedFilesystem(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	e.p.opts.CheckpointNFS = "fs-0123456789abcdef0.efs.us-east-1.amazonaws.com:/"
	first := jobSpecFor("ckpt-a", "", `echo 41 > "$FERRY_CHECKPOINT_DIR/step"; echo "dir $FERRY_CHECKPOINT_DIR"`, false)
	first.Job.CheckpointClaim = launcher.CheckpointClaim("7")
	a, err := e.p.Launch(context.Background(), first)
	if err != nil {
		t.Fatal(err)
	}
	if code := waitExited(t, e.p, a.ID); code != 0 {
		t.Fatalf("first node exited %d: %s", code, consoleOf(t, e, a.ID))
	}
	second := jobSpecFor("ckpt-b", "", `exit $(( $(cat "$FERRY_CHECKPOINT_DIR/step" 2>/dev/null || echo 0) + 1 ))`, false)
	second.Job.CheckpointClaim = first.Job.CheckpointClaim
	second.Placement.Zone = "use1-az2"
	b, err := e.p.Launch(context.Background(), second)
	if err != nil {
		t.Fatal(err)
	}
	if code := waitExited(t, e.p, b.ID); code != 42 {
		t.Errorf("the node in another zone exited %d, want 42 (it read the first node's checkpoint): %s", code, consoleOf(t, e, b.ID))
	}

	// Without a shared filesystem, each VM's checkpoint is its own.
	e.p.opts.CheckpointNFS = ""
	third := jobSpecFor("ckpt-c", "", second.Run, false)
	third.Job.CheckpointClaim = first.Job.CheckpointClaim
	c, err := e.p.Launch(context.Background(), third)
	if err != nil {
		t.Fatal(err)
	}
	if code := waitExited(t, e.p, c.ID); code != 1 || !strings.Contains(consoleOf(t, e, c.ID), "does not survive a recovery") {
		t.Errorf("without checkpoint_nfs: exit %d, console:\n%s", code, consoleOf(t, e, c.ID))
	}
}

// consoleOf is an instance's console output as StreamLogs gives it.
func consoleOf(t *testing.T, e env, id string) string {
	t.Helper()
	var b bytes.Buffer
	_ = e.p.StreamLogs(context.Background(), id, launcher.LogOptions{Tail: -1}, &b)
	return b.String()
}
