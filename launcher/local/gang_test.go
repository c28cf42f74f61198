package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/launcher"
)

// failRank wraps the local provider and refuses to launch one rank, as a cloud out of capacity
// in the middle of a gang would.
type failRank struct {
	*Provider
	rank string
}

func (f failRank) Launch(ctx context.Context, spec launcher.Spec) (launcher.Instance, error) {
	if spec.Labels[launcher.LabelNodeRank] == f.rank {
		return launcher.Instance{}, fmt.Errorf("%w: no room for rank %s", launcher.ErrNoCapacity, f.rank)
	}
	return f.Provider.Launch(ctx, spec)
}

func gangSpec(dir string) launcher.Spec {
	return launcher.Spec{
		Name:   "train",
		Labels: map[string]string{launcher.LabelOwner: "true", "job": "train"},
		Run:    `echo "$SKYPILOT_NODE_RANK/$SKYPILOT_NUM_NODES" > ` + dir + `/rank-$SKYPILOT_NODE_RANK; exec sleep 60`,
	}
}

func TestLaunchGangAllUp(t *testing.T) {
	p := newProvider(t, Options{})
	dir := t.TempDir()
	ctx := context.Background()
	insts, err := launcher.LaunchGang(ctx, p, gangSpec(dir), 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, in := range insts {
			_ = p.Terminate(context.Background(), in.ID)
		}
	})
	for rank, in := range insts {
		if want := fmt.Sprintf("train-%d", rank); in.Name != want || in.Labels[launcher.LabelNodeRank] != fmt.Sprint(rank) {
			t.Errorf("node %d: name %q labels %v, want %q with its rank", rank, in.Name, in.Labels, want)
		}
		file := filepath.Join(dir, fmt.Sprintf("rank-%d", rank))
		deadline := time.Now().Add(10 * time.Second)
		for {
			b, err := os.ReadFile(file)
			if err == nil && strings.TrimSpace(string(b)) == fmt.Sprintf("%d/3", rank) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d never wrote its rank (%q, %v)", rank, b, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func TestLaunchGangAllOrNothing(t *testing.T) {
	p := newProvider(t, Options{})
	ctx := context.Background()
	_, err := launcher.LaunchGang(ctx, failRank{Provider: p, rank: "1"}, gangSpec(t.TempDir()), 3)
	if !errors.Is(err, launcher.ErrNoCapacity) {
		t.Fatalf("err = %v, want the capacity error of rank 1", err)
	}
	// The two nodes that did start were terminated: nothing of the gang is left running.
	insts, err := p.List(ctx, map[string]string{"job": "train"})
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range insts {
		if in.State == launcher.StateRunning || in.State == launcher.StatePending {
			t.Errorf("node %s still %s after the gang failed", in.Name, in.State)
		}
	}
	if _, err := launcher.LaunchGang(ctx, p, gangSpec(t.TempDir()), 0); !errors.Is(err, launcher.ErrInvalid) {
		t.Errorf("gang of 0: err = %v, want ErrInvalid", err)
	}
}

// waitExited polls List until every node of the selector has ended, and returns them by rank.
func waitExited(t *testing.T, p *Provider, selector map[string]string, n int) []launcher.Instance {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		insts, err := p.List(context.Background(), selector)
		if err != nil {
			t.Fatal(err)
		}
		done := 0
		for _, in := range insts {
			if in.State == launcher.StateTerminated {
				done++
			}
		}
		if len(insts) == n && done == n {
			slices.SortFunc(insts, func(a, b launcher.Instance) int {
				return strings.Compare(a.Labels[launcher.LabelNodeRank], b.Labels[launcher.LabelNodeRank])
			})
			return insts
		}
		if time.Now().After(deadline) {
			t.Fatalf("nodes did not all end: %+v", insts)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A job's gang on local: each node has a loopback address of its own, the same fixed port,
// finds rank 0 first in SKYPILOT_NODE_IPS, and talks to it over TCP; exit statuses come back.
func TestJobGangRendezvousOverTCP(t *testing.T) {
	p := newProvider(t, Options{})
	spec := launcher.Spec{
		Name:   "ring",
		Labels: map[string]string{"job": "ring"},
		Port:   29500,
		Job:    &launcher.JobSpec{CheckpointClaim: "ring-ckpt"},
		// Rank 0 serves one line on its own address and port 29500; rank 1 reads it from the
		// first address in SKYPILOT_NODE_IPS, as torchrun's --master_addr does. bash's
		// /dev/tcp connects; python is not needed.
		Run: `master=$(echo "$SKYPILOT_NODE_IPS" | head -n1)
if [ "$SKYPILOT_NODE_RANK" = 0 ]; then
  [ "$FERRY_HOST" = "$master" ] || { echo "rank 0 is $FERRY_HOST, not $master"; exit 3; }
  exec ferry-test-listen "$FERRY_HOST:$FERRY_PORT" "hello from $FERRY_HOST"
fi
for i in $(seq 100); do
  if exec 3<>/dev/tcp/$master/29500; then read -r line <&3; echo "$line" > "$FERRY_CHECKPOINT_DIR/heard"; exit 0; fi
  sleep 0.1
done
exit 4`,
	}
	bin := buildListener(t)
	p.opts.PathPrepend = []string{bin}
	insts, err := launcher.LaunchGang(context.Background(), p, spec, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, in := range insts {
			_ = p.Terminate(context.Background(), in.ID)
		}
	})
	if insts[0].IP == insts[1].IP || !strings.HasPrefix(insts[0].IP, "127.") || insts[0].Endpoint != insts[0].IP+":29500" {
		t.Fatalf("nodes %+v: want two loopback addresses of their own, each on port 29500", insts)
	}
	ended := waitExited(t, p, map[string]string{"job": "ring"}, 2)
	for rank, in := range ended {
		if code, ok := in.Exited(); !ok || code != 0 {
			log, _ := p.LogPath(in.ID)
			out, _ := os.ReadFile(log)
			t.Errorf("rank %d: exit %v (%s); output:\n%s", rank, in.ExitCode, in.Reason, out)
		}
	}
	heard, err := os.ReadFile(filepath.Join(p.opts.CheckpointRoot, "ring-ckpt", "heard"))
	if err != nil || strings.TrimSpace(string(heard)) != "hello from "+insts[0].IP {
		t.Errorf("rank 1 heard %q (%v), want rank 0's greeting", heard, err)
	}
}

// buildListener builds a tiny program that accepts one connection on an address, writes a
// line to it and exits 0: rank 0 of the rendezvous test.
func buildListener(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte(`package main

import (
	"fmt"
	"net"
	"os"
)

func main() {
	l, err := net.Listen("tcp", os.Args[1])
	if err != nil {
		fmt.Println(err)
		os.Exit(5)
	}
	c, err := l.Accept()
	if err != nil {
		os.Exit(6)
	}
	fmt.Fprintln(c, os.Args[2])
	c.Close()
}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("go", "build", "-o", filepath.Join(dir, "ferry-test-listen"), src).CombinedOutput()
	if err != nil {
		t.Fatalf("build listener: %v\n%s", err, out)
	}
	return dir
}

// Exit statuses outlive the controller that started the nodes: a new Provider over the same
// directory (a restarted controller) reads them from the wrapper's file.
func TestJobExitStatusSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	p := newProvider(t, Options{Dir: dir})
	for _, tc := range []struct{ name, run, setup string }{{"ok", "exit 0", ""}, {"fails", "exit 42", ""}, {"setup", "exit 0", "false"}} {
		spec := launcher.Spec{Name: tc.name, Labels: map[string]string{"job": tc.name}, Run: tc.run, Setup: tc.setup, Job: &launcher.JobSpec{}}
		if _, err := p.Launch(context.Background(), spec); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"ok", "fails", "setup"} {
		waitExited(t, p, map[string]string{"job": name}, 1)
	}
	later := newProvider(t, Options{Dir: dir})
	for name, want := range map[string]int{"ok": 0, "fails": 42, "setup": launcher.ExitSetupFailed} {
		insts, err := later.List(context.Background(), map[string]string{"job": name})
		if err != nil || len(insts) != 1 {
			t.Fatalf("%s: %v %v", name, insts, err)
		}
		// Forget what the first provider recorded, as if it had died before its Wait returned.
		meta, err := loadMetadata(filepath.Join(dir, insts[0].ID))
		if err != nil {
			t.Fatal(err)
		}
		meta.ExitCode, meta.ExitReason = nil, ""
		if err := saveMetadata(filepath.Join(dir, insts[0].ID), meta); err != nil {
			t.Fatal(err)
		}
		insts, _ = later.List(context.Background(), map[string]string{"job": name})
		if code, ok := insts[0].Exited(); !ok || code != want {
			t.Errorf("%s: exit %v, want %d", name, insts[0].ExitCode, want)
		}
	}
}

// A node stopped by Terminate did not end by itself: it reports no exit status, and it had
// the job's grace, not the provider's, between SIGTERM and SIGKILL.
func TestJobNodeStoppedHasNoExitStatus(t *testing.T) {
	p := newProvider(t, Options{StopGrace: 50 * time.Millisecond})
	mark := filepath.Join(t.TempDir(), "term")
	spec := launcher.Spec{Name: "long", Labels: map[string]string{"job": "long"}, Job: &launcher.JobSpec{Grace: 5 * time.Second},
		Run: `trap 'sleep 0.5; echo checkpointed > ` + mark + `; exit 0' TERM; while true; do sleep 0.05; done`}
	inst, err := p.Launch(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // let bash install its trap
	if err := p.Terminate(context.Background(), inst.ID); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(mark); err != nil || strings.TrimSpace(string(b)) != "checkpointed" {
		t.Errorf("the job had no time to checkpoint after SIGTERM: %q %v", b, err)
	}
}
