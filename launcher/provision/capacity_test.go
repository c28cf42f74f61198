package provision

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// A launch held in a queue stops failover and blocks nothing: the next try goes to the same
// place first.
func TestQueuedLaunchStopsFailover(t *testing.T) {
	ctx := context.Background()
	queued := gcpZ1
	queued.Queued = true
	p, provs, _ := newTest(t, []launcher.Placement{queued, awsZ1})
	since := time.Date(2026, 11, 23, 11, 0, 0, 0, time.UTC)
	provs["gcp"].fail = []error{launcher.Queued(since, "resize request is ACCEPTED"), launcher.Queued(since, "resize request is ACCEPTED")}

	for try := 1; try <= 2; try++ {
		_, err := p.LaunchGang(ctx, spec("job-1-1"), 1)
		q, ok := launcher.AsQueued(err)
		if !ok || !q.Since.Equal(since) {
			t.Fatalf("try %d: %v, want the queue's ErrQueued", try, err)
		}
	}
	if n := len(provs["aws"].tries); n != 0 {
		t.Fatalf("aws tried %d times behind a queued launch", n)
	}
	choices, err := p.Plan(ctx, configs.Resources{})
	if err != nil {
		t.Fatal(err)
	}
	if !choices[0].BlockedUntil.IsZero() || choices[0].Infra != "gcp" {
		t.Fatalf("first choice %+v, want the queued place, unblocked", choices[0])
	}
	insts, err := p.LaunchGang(ctx, spec("job-1-1"), 1)
	if err != nil || len(insts) != 1 || insts[0].Infra != "gcp" {
		t.Fatalf("once provisioned: %+v, %v", insts, err)
	}
}

// withdrawing is a scripted provider that holds queued requests.
type withdrawing struct {
	*scripted
	asked []string
	err   error
}

func (w *withdrawing) WithdrawQueued(_ context.Context, job string, attempt int) error {
	w.asked = append(w.asked, fmt.Sprintf("%s/%d", job, attempt))
	return w.err
}

func TestWithdrawQueuedFansOut(t *testing.T) {
	a := &withdrawing{scripted: &scripted{infra: "aws"}}
	g := &withdrawing{scripted: &scripted{infra: "gcp"}, err: errors.New("denied")}
	p, err := New(Options{Infras: []Infra{{Name: "aws", Provider: a}, {Name: "gcp", Provider: g}, {Name: "local", Provider: &scripted{infra: "local"}}},
		Planner: PlannerFunc(func(context.Context, configs.Resources) ([]launcher.Placement, error) { return nil, nil })})
	if err != nil {
		t.Fatal(err)
	}
	err = p.WithdrawQueued(context.Background(), "7", 3)
	if len(a.asked) != 1 || a.asked[0] != "7/3" || len(g.asked) != 1 || err == nil || err.Error() != "gcp: denied" {
		t.Fatalf("asked aws %v, gcp %v; err %v", a.asked, g.asked, err)
	}
}
