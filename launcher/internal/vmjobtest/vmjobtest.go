// Package vmjobtest holds what the tests of the VM clouds' job nodes (launcher/aws against
// fakeec2, launcher/gcp against fakecompute) share: the program a gang's nodes run to talk over
// TCP (GangNode), and the checks every VM job node passes whatever its cloud: exit codes, logs,
// a gang's rendezvous, a checkpoint shared across zones, a gang beyond capacity. Each cloud's
// tests add what is its own around them (placement groups, firewall rules, how a warning comes).
package vmjobtest

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/vmnode"
)

// Job is the job every node of these tests belongs to (its LabelJob).
const Job = "7"

// Timeout bounds every wait on a node.
const Timeout = 30 * time.Second

// Provider is a VM cloud's provider as the checks use it.
type Provider interface {
	launcher.Provider
	launcher.LogStreamer
}

// Cloud is a VM provider under test with its fake.
type Cloud struct {
	Provider Provider
	// Spec is a job node's on-demand spec in the cloud's test zone, labeled with Job and
	// attempt 1.
	Spec func(name, setup, run string) launcher.Spec
	// Console is the node's output as the fake keeps it, for waits and failure messages.
	Console func(in launcher.Instance) string
}

// Context is a context for one test's calls, bounded by twice Timeout.
func Context(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*Timeout)
	t.Cleanup(cancel)
	return ctx
}

// WaitFor polls cond until it holds or Timeout passes: it waits on observed state, not time.
func WaitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(Timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Listed is the instance id as List reports it now; State GONE when List does not.
func Listed(t *testing.T, p launcher.Provider, id string) launcher.Instance {
	t.Helper()
	insts, err := p.List(context.Background(), map[string]string{launcher.LabelJob: Job})
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

// WaitExited waits until List reports the node ended by itself and returns its exit status.
func WaitExited(t *testing.T, c Cloud, in launcher.Instance) int {
	t.Helper()
	var got launcher.Instance
	WaitFor(t, in.Name+" to exit", func() bool {
		got = Listed(t, c.Provider, in.ID)
		return got.ExitCode != nil
	})
	if got.State != launcher.StateTerminated {
		t.Fatalf("%s exited with %d but is %s", in.Name, *got.ExitCode, got.State)
	}
	return *got.ExitCode
}

// LaunchGang launches a 2-node gang whose nodes run GangNode (the test binary itself).
func LaunchGang(t *testing.T, c Cloud) []launcher.Instance {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	s := c.Spec("train", `echo "setup on rank $SKYPILOT_SETUP_NODE_RANK"`, `exec "$TEST_BIN"`)
	s.Envs = map[string]string{"TEST_BIN": self, EnvGangNode: "1"}
	insts, err := launcher.LaunchGang(Context(t), c.Provider, s, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range insts {
		if in.IP == "" {
			t.Fatalf("node %s has no address", in.Name)
		}
	}
	return insts
}

// CheckGangTalked waits for a LaunchGang's nodes to exit 0 and checks what they said: each
// learned the gang's addresses, rank 0 first, and rank 1 reached rank 0 from its own.
func CheckGangTalked(t *testing.T, c Cloud, insts []launcher.Instance) {
	t.Helper()
	for _, in := range insts {
		if rc := WaitExited(t, c, in); rc != 0 {
			t.Fatalf("%s exited %d; console:\n%s", in.Name, rc, c.Console(in))
		}
	}
	ips := []string{insts[0].IP, insts[1].IP}
	rank0, rank1 := c.Console(insts[0]), c.Console(insts[1])
	for _, want := range []string{"setup on rank 0", "node ips [" + ips[0] + " " + ips[1] + "]", `rank 0 heard "hello from rank 1" from ` + ips[1], vmnode.ExitMarker + "0"} {
		if !strings.Contains(rank0, want) {
			t.Errorf("rank 0's console lacks %q:\n%s", want, rank0)
		}
	}
	if want := `rank 1 got "welcome" from rank 0 at ` + ips[0]; !strings.Contains(rank1, want) {
		t.Errorf("rank 1's console lacks %q:\n%s", want, rank1)
	}
}

// CheckExitCodes: a node launched alone reports its run's exit status (a setup failure
// launcher.ExitSetupFailed, a run killed by a signal 128 and its number), and a node still
// running, or terminated by the provider, none.
func CheckExitCodes(t *testing.T, c Cloud) {
	ctx := Context(t)
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
			in, err := c.Provider.Launch(ctx, c.Spec("exit-"+strings.ReplaceAll(name, " ", "-"), tc.setup, tc.run))
			if err != nil {
				t.Fatal(err)
			}
			if got := WaitExited(t, c, in); got != tc.want {
				t.Fatalf("exit code %d, want %d; console:\n%s", got, tc.want, c.Console(in))
			}
		})
	}
	running, err := c.Provider.Launch(ctx, c.Spec("long", "", "exec sleep 300"))
	if err != nil {
		t.Fatal(err)
	}
	if in := Listed(t, c.Provider, running.ID); in.State != launcher.StateRunning || in.ExitCode != nil {
		t.Fatalf("running node: %s, exit code %v; want running without one", in.State, in.ExitCode)
	}
	if err := c.Provider.Terminate(ctx, running.ID); err != nil {
		t.Fatal(err)
	}
	if in := Listed(t, c.Provider, running.ID); in.ExitCode != nil {
		t.Fatalf("terminated node has exit code %d, want none", *in.ExitCode)
	}
}

// CheckLogs: StreamLogs writes the console's last lines, and with Follow what the node prints
// later, until it has ended. The provider should read the console again every few
// milliseconds.
func CheckLogs(t *testing.T, c Cloud) {
	ctx := Context(t)
	goFile := t.TempDir() + "/go"
	s := c.Spec("logs", "", `for i in 1 2 3 4; do echo "line $i"; done
while [ ! -e "$GO_FILE" ]; do sleep 0.05; done
echo "line 5"; exit 4`)
	s.Envs = map[string]string{"GO_FILE": goFile}
	in, err := c.Provider.Launch(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	WaitFor(t, "line 4", func() bool { return strings.Contains(c.Console(in), "line 4\n") })
	var last bytes.Buffer
	if err := c.Provider.StreamLogs(ctx, in.ID, launcher.LogOptions{Tail: 2}, &last); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff("line 3\nline 4\n", last.String()); d != "" {
		t.Fatalf("tail 2 (-want +got):\n%s", d)
	}
	var followed bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- c.Provider.StreamLogs(ctx, in.ID, launcher.LogOptions{Tail: -1, Follow: true}, &followed)
	}()
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?s)line 1\n.*line 4\n.*line 5\n.*` + vmnode.ExitMarker + `4\n`).MatchString(followed.String()) {
		t.Fatalf("followed logs lack lines 1-5 and the exit status:\n%s", followed.String())
	}
}

// PreemptibleRun is a spot node's run that trains until SIGTERM, then says what the preemption
// file held, saves a checkpoint and says so.
const PreemptibleRun = `trap 'echo "SIGTERM with $(cat "$` + vmnode.EnvPreemptionFile + `")"; echo saved > "$FERRY_CHECKPOINT_DIR/step"; echo checkpointed; exit 0' TERM
echo training
while :; do sleep 0.1; done`

// WaitTraining waits until a node running PreemptibleRun trains.
func WaitTraining(t *testing.T, c Cloud, in launcher.Instance) {
	t.Helper()
	WaitFor(t, "training", func() bool { return strings.Contains(c.Console(in), "training") })
}

// graceRE finds what a PreemptibleRun said at SIGTERM.
var graceRE = regexp.MustCompile(`SIGTERM with ` + launcher.EnvPreemptionGrace + `=(\d+)\n`)

// WaitWarned waits until a node running PreemptibleRun got SIGTERM with the seconds left in
// the preemption file, and returns them.
func WaitWarned(t *testing.T, c Cloud, in launcher.Instance) int {
	t.Helper()
	WaitFor(t, "SIGTERM with the time left", func() bool { return graceRE.MatchString(c.Console(in)) })
	left, _ := strconv.Atoi(graceRE.FindStringSubmatch(c.Console(in))[1])
	return left
}

// CheckPreempted: a preempted node reports PREEMPTED, no exit status, and marked none.
func CheckPreempted(t *testing.T, c Cloud, in launcher.Instance) {
	t.Helper()
	got := Listed(t, c.Provider, in.ID)
	if got.State != launcher.StatePreempted || got.ExitCode != nil {
		t.Fatalf("preempted node: %s, exit code %v; want PREEMPTED without one", got.State, got.ExitCode)
	}
	if strings.Contains(c.Console(in), vmnode.ExitMarker) {
		t.Fatalf("a preempted node marked an exit status:\n%s", c.Console(in))
	}
}

// CheckCheckpointShared: with the cloud's checkpoint_nfs set, a node launched later in
// otherZone of the region, as a recovery is, finds what the first node saved in its claim's
// checkpoint directory. It returns the claim, for a check without the shared filesystem.
func CheckCheckpointShared(t *testing.T, c Cloud, otherZone string) (claim string) {
	first := c.Spec("ckpt-a", "", `echo 41 > "$FERRY_CHECKPOINT_DIR/step"; echo "dir $FERRY_CHECKPOINT_DIR"`)
	first.Job.CheckpointClaim = launcher.CheckpointClaim(Job)
	a, err := c.Provider.Launch(context.Background(), first)
	if err != nil {
		t.Fatal(err)
	}
	if code := WaitExited(t, c, a); code != 0 {
		t.Fatalf("first node exited %d: %s", code, c.Console(a))
	}
	second := c.Spec("ckpt-b", "", ReadCheckpointRun)
	second.Job.CheckpointClaim = first.Job.CheckpointClaim
	second.Placement.Zone = otherZone
	b, err := c.Provider.Launch(context.Background(), second)
	if err != nil {
		t.Fatal(err)
	}
	if code := WaitExited(t, c, b); code != 42 {
		t.Errorf("the node in another zone exited %d, want 42 (it read the first node's checkpoint): %s", code, c.Console(b))
	}
	return first.Job.CheckpointClaim
}

// ReadCheckpointRun exits with one more than the step the checkpoint holds (1 without one).
const ReadCheckpointRun = `exit $(( $(cat "$FERRY_CHECKPOINT_DIR/step" 2>/dev/null || echo 0) + 1 ))`

// CheckGangBeyondCapacity: a job's gang that does not fit where the cloud has room for one node
// fails with ErrNoCapacity and leaves nothing List reports.
func CheckGangBeyondCapacity(t *testing.T, c Cloud) {
	t.Helper()
	ctx := Context(t)
	_, err := launcher.LaunchGang(ctx, c.Provider, c.Spec("big", "", "exec sleep 300"), 2)
	if !errors.Is(err, launcher.ErrNoCapacity) {
		t.Fatalf("gang beyond capacity: %v, want ErrNoCapacity", err)
	}
	if left, err := c.Provider.List(ctx, map[string]string{launcher.LabelJob: Job}); err != nil || len(left) != 0 {
		t.Fatalf("a failed gang left %+v (%v)", left, err)
	}
}

var updateGolden = flag.Bool("update", false, "rewrite testdata/jobboot-*.golden from the current renderer")

// CheckBootGolden pins the script a job node boots with: boot renders it for a spot node with
// a checkpoint claim, without and with a shared checkpoint filesystem (nfs), and the package's
// testdata/jobboot-local.golden and jobboot-nfs.golden hold what it must be. What runs on the
// VM changes only with a reviewed change to them (go test -run TestJobBootGolden -update).
func CheckBootGolden(t *testing.T, boot func(nfs string) (string, error)) {
	for name, nfs := range map[string]string{"local": "", "nfs": "10.0.0.2:/checkpoints"} {
		t.Run(name, func(t *testing.T) {
			got, err := boot(nfs)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", "jobboot-"+name+".golden")
			if *updateGolden {
				if err := os.MkdirAll("testdata", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(string(want), got); d != "" {
				t.Fatalf("job boot script (-%s +rendered):\n%s", path, d)
			}
		})
	}
}
