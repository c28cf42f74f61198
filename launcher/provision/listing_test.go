package provision

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// newLive is a provisioner over scripted infras on the real clock, with short deadlines: the
// listing tests race real goroutines against real timers.
func newLive(t *testing.T, places []launcher.Placement) (*Provisioner, map[string]*scripted) {
	t.Helper()
	provs := map[string]*scripted{}
	var infras []Infra
	for _, name := range []string{"kubernetes/test", "aws", "gcp", configs.InfraLocal} {
		provs[name] = &scripted{infra: name}
		infras = append(infras, Infra{Name: name, Provider: provs[name]})
	}
	p, err := New(Options{
		Infras:          infras,
		Planner:         PlannerFunc(func(context.Context, configs.Resources) ([]launcher.Placement, error) { return places, nil }),
		ListTimeout:     time.Second,
		StraggleFor:     150 * time.Millisecond,
		CallTimeout:     time.Second,
		JanitorInterval: 50 * time.Millisecond,
		Health:          NewHealth(HealthOptions{OpenFor: 100 * time.Millisecond, MaxOpenFor: 200 * time.Millisecond}),
	})
	if err != nil {
		t.Fatal(err)
	}
	return p, provs
}

func running(infra, id string, labels map[string]string) launcher.Instance {
	return launcher.Instance{ID: id, Infra: infra, Labels: labels, State: launcher.StateRunning, LaunchedAt: time.Now().Add(-time.Hour)}
}

var svcLabels = map[string]string{launcher.LabelService: "svc"}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestListDoesNotWaitForAHungInfra(t *testing.T) {
	p, provs := newLive(t, nil)
	provs[configs.InfraLocal].insts = []launcher.Instance{running("local", "local-svc-1", svcLabels)}
	provs["aws"].insts = []launcher.Instance{running("aws", "aws/us-east-1/i-1", svcLabels)}
	hang := make(chan struct{})
	defer close(hang)
	provs["aws"].lsHang = hang

	began := time.Now()
	got, err := p.List(context.Background(), svcLabels)
	took := time.Since(began)
	gaps, partial := launcher.Partial(err)
	if !partial || len(gaps) != 1 || gaps[0].Infra != "aws" || !errors.Is(gaps[0].Err, launcher.ErrUnavailable) {
		t.Fatalf("List = %v, %v; want aws as an unavailable gap", got, err)
	}
	if len(got) != 1 || got[0].ID != "local-svc-1" {
		t.Fatalf("listed %v, want the local instance", got)
	}
	if took > 700*time.Millisecond {
		t.Fatalf("List waited %v for a hung infra, want about the straggle wait (150ms)", took)
	}
	// The hung call runs out its deadline in the background: the breaker opens, and nobody
	// waits for aws again.
	eventually(t, 5*time.Second, "aws down after its List timed out", func() bool {
		return p.Health().State("aws", "").State == StateDown
	})
	if s := p.Health().State("aws", ""); s.LastClass != ClassTimeout {
		t.Fatalf("aws %+v, want a timeout", s)
	}
	began = time.Now()
	_, err = p.List(context.Background(), svcLabels)
	if took := time.Since(began); took > 100*time.Millisecond {
		t.Fatalf("List with aws down took %v, want at once", took)
	}
	var down *DownError
	if gaps, _ := launcher.Partial(err); len(gaps) != 1 || !errors.As(gaps[0].Err, &down) {
		t.Fatalf("List with aws down: %v, want its DownError as the gap", err)
	}
}

func TestListZonalGapsStayTheProvidersOwn(t *testing.T) {
	p, provs := newLive(t, nil)
	provs["gcp"].insts = []launcher.Instance{running("gcp", "gcp/us-central1-a/svc-1", svcLabels)}
	gcp := &partialLister{scripted: provs["gcp"], gaps: []launcher.Gap{{Region: "us-central1", Zone: "us-central1-f", Err: fmt.Errorf("%w: zone", launcher.ErrNotFound)}}}
	p.infras["gcp"] = gcp
	got, err := p.ListIn(context.Background(), []string{"gcp"}, svcLabels)
	gaps, partial := launcher.Partial(err)
	if !partial || len(gaps) != 1 || gaps[0].Infra != "gcp" || gaps[0].Zone != "us-central1-f" || len(got) != 1 {
		t.Fatalf("ListIn = %v, %v; want the instance and the zone's gap, named for gcp", got, err)
	}
	if p.Health().State("gcp", "").State != StateUp {
		t.Fatalf("a zone's gap took the infra down: %+v", p.Health().State("gcp", ""))
	}
	if _, err := p.ListIn(context.Background(), []string{"azure"}, nil); err == nil {
		t.Fatal("ListIn over an infra not enabled reported no gap")
	}
}

// partialLister lists its scripted instances and reports gaps.
type partialLister struct {
	*scripted
	gaps []launcher.Gap
}

func (p *partialLister) List(ctx context.Context, sel map[string]string) ([]launcher.Instance, error) {
	insts, err := p.scripted.List(ctx, sel)
	if err != nil {
		return nil, err
	}
	return insts, launcher.PartialList(slices.Clone(p.gaps))
}

func TestLaunchSkipsADownInfra(t *testing.T) {
	p, provs := newLive(t, []launcher.Placement{awsZ1, gcpZ1})
	for range 3 {
		p.Health().Observe("aws", "", fmt.Errorf("%w: 503", launcher.ErrUnavailable))
	}
	inst, err := p.Launch(context.Background(), spec("svc-1"))
	if err != nil || inst.Infra != "gcp" {
		t.Fatalf("Launch = %+v, %v; want gcp", inst, err)
	}
	if n := len(provs["aws"].tries); n != 0 {
		t.Fatalf("aws tried %d times while down", n)
	}
	choices, err := p.Plan(context.Background(), configs.Resources{})
	if err != nil {
		t.Fatal(err)
	}
	if last := choices[len(choices)-1]; last.Infra != "aws" || last.BlockedBecause == "" {
		t.Fatalf("plan %+v, want aws last with why", choices)
	}
	// A launch failing as an infra moves on to the next infra at once.
	provs["gcp"].fail = []error{fmt.Errorf("%w: 503", launcher.ErrUnavailable)}
	p.Health().Observe("aws", "", nil)
	provs["aws"].fail = []error{fmt.Errorf("%w: RequestLimitExceeded", launcher.ErrThrottled)}
	if _, err := p.Launch(context.Background(), spec("svc-2")); err == nil {
		t.Fatal("both infras failing: Launch succeeded")
	}
	if s := p.Health().State("aws", ""); s.State != StateThrottled {
		t.Fatalf("aws after throttling: %+v", s)
	}
}

// memLedger is a Ledger in memory.
type memLedger struct {
	mu sync.Mutex
	m  map[string]launcher.Leftover
}

func (l *memLedger) PutLeftover(x launcher.Leftover) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string]launcher.Leftover{}
	}
	l.m[x.Key] = x
	return nil
}

func (l *memLedger) DeleteLeftover(key string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.m, key)
	return nil
}

func (l *memLedger) ListLeftovers() ([]launcher.Leftover, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Collect(maps.Values(l.m)), nil
}

func (l *memLedger) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}

func TestTerminateOnAFailingInfraIsFinishedByTheJanitor(t *testing.T) {
	p, provs := newLive(t, nil)
	provs["gcp"].termErr = fmt.Errorf("%w: 503", launcher.ErrUnavailable)
	err := p.Terminate(context.Background(), "gcp/us-central1-a/svc-1")
	left, ok := launcher.LeftBehind(err)
	if !ok || left.InstanceID != "gcp/us-central1-a/svc-1" || left.Infra != "gcp" {
		t.Fatalf("Terminate = %v, want it left behind", err)
	}
	// A selector leftover: what a teardown could not list. An instance launched after it is
	// something new and stays.
	cut := time.Now()
	provs["gcp"].insts = []launcher.Instance{
		running("gcp", "gcp/us-central1-b/svc-old", svcLabels),
		{ID: "gcp/us-central1-b/svc-new", Infra: "gcp", Labels: svcLabels, LaunchedAt: cut.Add(time.Second)},
	}
	if err := p.LeaveBehind(launcher.Leftover{Infra: "gcp", Selector: svcLabels, Before: cut, Owner: "service svc"}); err != nil {
		t.Fatal(err)
	}
	ledger := &memLedger{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = p.Run(ctx, ledger)
	}()
	defer func() { cancel(); <-done }()
	eventually(t, 5*time.Second, "leftovers written to the ledger", func() bool { return ledger.len() == 2 })
	// Still failing: nothing is forgotten.
	time.Sleep(200 * time.Millisecond) // a few janitor rounds, which must not drop anything
	if n := len(p.Leftovers()); n != 2 {
		t.Fatalf("%d leftovers while gcp fails, want 2", n)
	}
	provs["gcp"].mu.Lock()
	provs["gcp"].termErr = nil
	provs["gcp"].mu.Unlock()
	eventually(t, 5*time.Second, "leftovers stopped once gcp answers", func() bool { return len(p.Leftovers()) == 0 && ledger.len() == 0 })
	provs["gcp"].mu.Lock()
	defer provs["gcp"].mu.Unlock()
	if !slices.Contains(provs["gcp"].term, "gcp/us-central1-a/svc-1") || !slices.Contains(provs["gcp"].term, "gcp/us-central1-b/svc-old") ||
		slices.Contains(provs["gcp"].term, "gcp/us-central1-b/svc-new") {
		t.Fatalf("terminated %v; want the leftover and the old instance, not the new one", provs["gcp"].term)
	}
}

func TestJanitorResumesFromTheLedgerAndWaitsForTheInfra(t *testing.T) {
	ledger := &memLedger{}
	l := launcher.Leftover{Infra: "aws", InstanceID: "aws/us-east-1/i-9", Owner: "job 7", Since: time.Now()}
	l.Key = launcher.LeftoverKey(l)
	if err := ledger.PutLeftover(l); err != nil {
		t.Fatal(err)
	}
	p, provs := newLive(t, nil)
	hang := make(chan struct{})
	provs["aws"].lsHang = hang
	// aws is down: the janitor does not call it, and the probe (a List that hangs) keeps it so.
	p.Health().Observe("aws", "", fmt.Errorf("%w: %w", launcher.ErrUnavailable, context.DeadlineExceeded))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = p.Run(ctx, ledger)
	}()
	defer func() { cancel(); <-done }()
	eventually(t, 5*time.Second, "the ledger's leftover read back", func() bool { return len(p.Leftovers()) == 1 })
	time.Sleep(300 * time.Millisecond)
	provs["aws"].mu.Lock()
	n := len(provs["aws"].term)
	provs["aws"].mu.Unlock()
	if n != 0 {
		t.Fatalf("the janitor called aws %d times while it was down", n)
	}
	close(hang) // aws answers: the probe closes the breaker, the janitor goes
	eventually(t, 10*time.Second, "the leftover stopped after aws recovered", func() bool { return len(p.Leftovers()) == 0 && ledger.len() == 0 })
	if s := p.Health().State("aws", ""); s.State != StateUp {
		t.Fatalf("aws %+v after its probe answered", s)
	}
}
