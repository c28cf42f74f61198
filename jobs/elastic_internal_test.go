package jobs

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

func parseJob(t *testing.T, yaml string) Job {
	t.Helper()
	task, err := configs.Parse("job.yaml", []byte(yaml), configs.Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	return Job{Task: task}
}

func TestLaunchSizes(t *testing.T) {
	fixed := parseJob(t, "num_nodes: 4\nrun: x\n")
	el := parseJob(t, "num_nodes: 4\nresources:\n  job_recovery: {strategy: DYNAMIC_NODE_SET, min_nodes: 2}\nrun: x\n")
	one := parseJob(t, "num_nodes: 3\nresources:\n  job_recovery: DYNAMIC_NODE_SET\nrun: x\n")
	queued := el
	queued.InQueue, queued.GangSize = true, 3
	for name, tc := range map[string]struct {
		j    Job
		want []int
	}{
		"a fixed gang":            {fixed, []int{4}},
		"elastic, min_nodes 2":    {el, []int{4, 3, 2}},
		"elastic, min_nodes 1":    {one, []int{3, 2, 1}},
		"held in a cloud's queue": {queued, []int{3}},
	} {
		if diff := cmp.Diff(tc.want, launchSizes(tc.j)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", name, diff)
		}
	}
	if gangSize(fixed) != 4 || gangSize(Job{Task: fixed.Task, GangSize: 2}) != 2 {
		t.Error("gangSize: num_nodes unless a size was chosen")
	}
}

func TestSmallerMayFit(t *testing.T) {
	ctx := context.Background()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	for _, tc := range []struct {
		ctx  context.Context
		err  error
		want bool
	}{
		{ctx, fmt.Errorf("zone full: %w", launcher.ErrNoCapacity), true},
		{ctx, fmt.Errorf("down: %w", launcher.ErrUnavailable), true},
		{ctx, fmt.Errorf("gang of 17: %w", launcher.ErrInvalid), true},
		{ctx, fmt.Errorf("held: %w", launcher.ErrQueued), false},
		{cancelled, fmt.Errorf("zone full: %w", launcher.ErrNoCapacity), false},
	} {
		if got := smallerMayFit(tc.ctx, tc.err); got != tc.want {
			t.Errorf("smallerMayFit(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// Grow placeholders go where the gang runs: its context, or its cloud's region and zone, on
// every alternative.
func TestPinned(t *testing.T) {
	r := configs.Resources{Accelerators: []configs.Accelerator{{Name: "A100", Count: 8}},
		AnyOf: []configs.Resources{{Infra: "aws"}, {Infra: "gcp"}}}
	for _, tc := range []struct {
		node Node
		want string
	}{
		{Node{Infra: "aws", Region: "us-east-1", Zone: "us-east-1a"}, "aws/us-east-1/us-east-1a"},
		{Node{Infra: "aws", Region: "us-east-1", Zone: "use1-az4"}, "aws/us-east-1"},
		{Node{Infra: "kubernetes/lab", Region: "lab"}, "kubernetes/lab"},
		{Node{Infra: "local"}, "local"},
	} {
		p := pinned(r, tc.node)
		for i, c := range append([]configs.Resources{p}, p.AnyOf...) {
			if c.Infra != tc.want {
				t.Errorf("%+v: candidate %d on %q, want %q", tc.node, i, c.Infra, tc.want)
			}
		}
		if r.AnyOf[0].Infra != "aws" {
			t.Fatal("pinned changed the task's own resources")
		}
	}
}
