package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
