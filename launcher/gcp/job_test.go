package gcp

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/gcp/fakecompute"
)

// jobSpecFor is a job node's spec: no service labels, a JobSpec.
func jobSpecFor(name, setup, run string, spot bool) launcher.Spec {
	s := spec(name, launcher.Placement{Zone: "us-central1-b", InstanceType: "n1-standard-4", Spot: spot})
	s.Labels = map[string]string{launcher.LabelJob: "7", launcher.LabelAttempt: "1"}
	s.Setup, s.Run = setup, run
	s.Job = &launcher.JobSpec{Priority: launcher.DefaultJobPriority, Grace: 10 * time.Second, CheckpointDir: "/ferry/checkpoints/7"}
	return s
}

// listed is the instance as List reports it now.
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
func waitExited(t *testing.T, e *env, in launcher.Instance) int {
	t.Helper()
	var got launcher.Instance
	waitFor(t, in.Name+" to exit", func() bool {
		got = listed(t, e.prov, in.ID)
		return got.ExitCode != nil
	})
	if got.State != launcher.StateTerminated {
		t.Fatalf("%s exited with %d but is %s", in.Name, *got.ExitCode, got.State)
	}
	return *got.ExitCode
}

func serial(e *env, in launcher.Instance) string { return e.fake.SerialOutput(in.Zone, in.Name) }

// TestJobGangTalksOverTCP: a 2-node job gang lands in one zone; each node learns the gang's
// internal IPs, rank 0 first, from its metadata server (an attribute set after insert); rank 1
// dials rank 0 on its IP from its own; both exit 0, which List reports as ExitCode 0 once the
// VMs have stopped.
func TestJobGangTalksOverTCP(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{})
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	s := jobSpecFor("train", `echo "setup on rank $SKYPILOT_SETUP_NODE_RANK"`, `exec "$TEST_BIN"`, false)
	s.Envs = map[string]string{"TEST_BIN": self, envGangNode: "1"}
	insts, err := launcher.LaunchGang(testCtx(t), e.prov, s, 2)
	if err != nil {
		t.Fatal(err)
	}
	var ips []string
	for _, in := range insts {
		vm, zone, _ := e.fake.Instance(in.Name)
		if in.IP == "" || in.IP != vm.GetNetworkInterfaces()[0].GetNetworkIP() || zone != "us-central1-b" {
			t.Fatalf("node %s: ip %q in %s; want its internal IP in us-central1-b", in.Name, in.IP, zone)
		}
		ips = append(ips, in.IP)
	}
	// On GCE the ranks reach each other only through a rule (the fake does not filter).
	fw, ok := e.fake.Firewall("ferry-jobs")
	if !ok || fw.GetPriority() >= allowPriority || !slices.Equal(fw.GetSourceTags(), []string{jobTag}) || !slices.Equal(fw.GetTargetTags(), []string{jobTag}) {
		t.Fatalf("ferry-jobs rule %v, want job nodes admitted from job nodes above the deny rules", fw)
	}
	for _, in := range insts {
		if vm, _, _ := e.fake.Instance(in.Name); !slices.Contains(vm.GetTags().GetItems(), jobTag) {
			t.Fatalf("%s has network tags %v, want %s", in.Name, vm.GetTags().GetItems(), jobTag)
		}
	}
	for _, in := range insts {
		if rc := waitExited(t, e, in); rc != 0 {
			t.Fatalf("%s exited %d; serial:\n%s", in.Name, rc, serial(e, in))
		}
		waitFor(t, in.Name+" TERMINATED (powered off)", func() bool {
			vm, _, _ := e.fake.Instance(in.Name)
			return vm.GetStatus() == "TERMINATED"
		})
	}
	rank0, rank1 := serial(e, insts[0]), serial(e, insts[1])
	for _, want := range []string{"setup on rank 0", "node ips [" + ips[0] + " " + ips[1] + "]", `rank 0 heard "hello from rank 1" from ` + ips[1], exitMarker + "0"} {
		if !strings.Contains(rank0, want) {
			t.Errorf("rank 0's serial output lacks %q:\n%s", want, rank0)
		}
	}
	if want := `rank 1 got "welcome" from rank 0 at ` + ips[0]; !strings.Contains(rank1, want) {
		t.Errorf("rank 1's serial output lacks %q:\n%s", want, rank1)
	}
}

// TestJobExitCodes: a node launched alone reports its run's exit status, a setup failure
// launcher.ExitSetupFailed, and a node still running or deleted none.
func TestJobExitCodes(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{})
	ctx := testCtx(t)
	for name, tc := range map[string]struct {
		setup, run string
		want       int
	}{
		"success":     {run: `test "$SKYPILOT_NODE_IPS" = "$FERRY_HOST" && test -d "$FERRY_CHECKPOINT_DIR"`, want: 0},
		"run fails":   {run: "exit 3", want: 3},
		"setup fails": {setup: "echo preparing; false", run: "echo never", want: launcher.ExitSetupFailed},
	} {
		t.Run(name, func(t *testing.T) {
			in, err := e.prov.Launch(ctx, jobSpecFor("exit-"+strings.ReplaceAll(name, " ", "-"), tc.setup, tc.run, false))
			if err != nil {
				t.Fatal(err)
			}
			if got := waitExited(t, e, in); got != tc.want {
				t.Fatalf("exit code %d, want %d; serial:\n%s", got, tc.want, serial(e, in))
			}
		})
	}
	running, err := e.prov.Launch(ctx, jobSpecFor("long", "", "exec sleep 300", false))
	if err != nil {
		t.Fatal(err)
	}
	if in := listed(t, e.prov, running.ID); in.State != launcher.StateRunning || in.ExitCode != nil {
		t.Fatalf("running node: %s, exit code %v; want running without one", in.State, in.ExitCode)
	}
	if err := e.prov.Terminate(ctx, running.ID); err != nil {
		t.Fatal(err)
	}
	if in := listed(t, e.prov, running.ID); in.ExitCode != nil {
		t.Fatalf("deleted node has exit code %d, want none", *in.ExitCode)
	}
}

// TestJobLogs: StreamLogs writes the serial port's last lines, and with Follow what the node
// prints later, until it has stopped.
func TestJobLogs(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{LogInterval: 50 * time.Millisecond})
	ctx := testCtx(t)
	dir := t.TempDir()
	s := jobSpecFor("logs", "", `for i in 1 2 3 4; do echo "line $i"; done
while [ ! -e "$GO_FILE" ]; do sleep 0.05; done
echo "line 5"; exit 4`, false)
	s.Envs = map[string]string{"GO_FILE": dir + "/go"}
	in, err := e.prov.Launch(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "line 4", func() bool { return strings.Contains(serial(e, in), "line 4\n") })
	var last bytes.Buffer
	if err := e.prov.StreamLogs(ctx, in.ID, launcher.LogOptions{Tail: 2}, &last); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff("line 3\nline 4\n", last.String()); d != "" {
		t.Fatalf("tail 2 (-want +got):\n%s", d)
	}
	var followed bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- e.prov.StreamLogs(ctx, in.ID, launcher.LogOptions{Tail: -1, Follow: true}, &followed) }()
	if err := os.WriteFile(dir+"/go", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?s)line 1\n.*line 4\n.*line 5\n.*` + exitMarker + `4\n`).MatchString(followed.String()) {
		t.Fatalf("followed logs lack lines 1-5 and the exit status:\n%s", followed.String())
	}
}

// TestJobPreemptionNotice: GCE's preemption notice (shortened) reaches the program as SIGTERM
// with the time left in the preemption file while the VM still runs it; the VM then stops, is
// PREEMPTED, and reports no exit status.
func TestJobPreemptionNotice(t *testing.T) {
	const notice = 6 * time.Second
	e := newEnv(t, fakecompute.Options{PreemptionNotice: notice}, Options{})
	ctx := testCtx(t)
	in, err := e.prov.Launch(ctx, jobSpecFor("spot", "", `trap 'echo "SIGTERM with $(cat "$FERRY_PREEMPTION_FILE")"; echo saved > "$FERRY_CHECKPOINT_DIR/step"; echo checkpointed; exit 0' TERM
echo training
while :; do sleep 0.1; done`, true))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "training", func() bool { return strings.Contains(serial(e, in), "training") })
	if err := e.fake.PreemptWithNotice(in.Name, notice); err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`SIGTERM with ` + launcher.EnvPreemptionGrace + `=(\d+)\n`)
	waitFor(t, "SIGTERM with the time left", func() bool { return re.MatchString(serial(e, in)) })
	if left, _ := strconv.Atoi(re.FindStringSubmatch(serial(e, in))[1]); left != int(notice/time.Second)-preemptionPoll {
		t.Fatalf("%d s left, want %d (the notice less the poll)", left, int(notice/time.Second)-preemptionPoll)
	}
	waitFor(t, "checkpointed", func() bool { return strings.Contains(serial(e, in), "checkpointed") })
	if vm, _, _ := e.fake.Instance(in.Name); vm.GetStatus() != "STOPPING" {
		t.Fatalf("the VM is %s when its program checkpointed, want STOPPING (still within the notice)", vm.GetStatus())
	}
	waitFor(t, "stopped", func() bool {
		vm, _, _ := e.fake.Instance(in.Name)
		return vm.GetStatus() == "TERMINATED"
	})
	got := listed(t, e.prov, in.ID)
	if got.State != launcher.StatePreempted || got.ExitCode != nil {
		t.Fatalf("preempted node: %s, exit code %v; want PREEMPTED without one", got.State, got.ExitCode)
	}
	if strings.Contains(serial(e, in), exitMarker) {
		t.Fatalf("a preempted node marked an exit status:\n%s", serial(e, in))
	}
}

// TestJobGangNoCapacity: a job's gang that does not fit in the zone fails with ErrNoCapacity
// and leaves nothing.
func TestJobGangNoCapacity(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{})
	ctx := testCtx(t)
	e.fake.SetCapacity("us-central1-b", "n1-standard-4", 1)
	_, err := launcher.LaunchGang(ctx, e.prov, jobSpecFor("big", "", "exec sleep 300", false), 2)
	checkError(t, err, launcher.ErrNoCapacity)
	if left, err := e.prov.List(ctx, map[string]string{launcher.LabelJob: "7"}); err != nil || len(left) != 0 {
		t.Fatalf("a failed gang left %+v (%v)", left, err)
	}
}

func TestParseExitStatus(t *testing.T) {
	for name, tc := range map[string]struct {
		console string
		want    int
		wantOK  bool
	}{
		"none":            {console: "hello\n"},
		"plain":           {console: "x\n" + exitMarker + "0\n", wantOK: true},
		"agent prefix":    {console: "Nov 25 21:00:00 vm google_metadata_script_runner[9]: startup-script: " + exitMarker + "42\r\n", want: 42, wantOK: true},
		"last one counts": {console: exitMarker + "1\nmore\n" + exitMarker + "2\n", want: 2, wantOK: true},
	} {
		t.Run(name, func(t *testing.T) {
			got, ok := parseExitStatus(tc.console)
			if ok != tc.wantOK || got != tc.want {
				t.Fatalf("parseExitStatus = %d, %v; want %d, %v", got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

// TestJobCheckpointOnSharedFilesystem: with checkpoint_nfs, a node launched later in another
// zone of the region (a recovery) finds the first node's checkpoint on the shared filesystem.
func TestJobCheckpointOnSharedFilesystem(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{CheckpointNFS: "10.0.0.2:/checkpoints"})
	first := jobSpecFor("ckpt-a", "", `echo 41 > "$FERRY_CHECKPOINT_DIR/step"`, false)
	first.Job.CheckpointClaim = launcher.CheckpointClaim("7")
	a, err := e.prov.Launch(context.Background(), first)
	if err != nil {
		t.Fatal(err)
	}
	if code := waitExited(t, e, a); code != 0 {
		t.Fatalf("first node exited %d: %s", code, serial(e, a))
	}
	second := jobSpecFor("ckpt-b", "", `exit $(( $(cat "$FERRY_CHECKPOINT_DIR/step" 2>/dev/null || echo 0) + 1 ))`, false)
	second.Job.CheckpointClaim = first.Job.CheckpointClaim
	second.Placement.Zone = "us-central1-a"
	b, err := e.prov.Launch(context.Background(), second)
	if err != nil {
		t.Fatal(err)
	}
	if code := waitExited(t, e, b); code != 42 {
		t.Errorf("the node in another zone exited %d, want 42: %s", code, serial(e, b))
	}
}
