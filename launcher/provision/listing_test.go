package provision

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
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

// zonal lists two zones of "gcp", asking each unless the List's context says to skip it;
// zone b hangs until its context ends while hangB is set.
type zonal struct {
	scripted
	mu     sync.Mutex
	hangB  bool
	asked  map[string]int
	termed []string
	failB  error
}

func (z *zonal) List(ctx context.Context, sel map[string]string) ([]launcher.Instance, error) {
	var out []launcher.Instance
	var gaps []launcher.Gap
	for _, zone := range []string{"us-central1-a", "us-central1-b"} {
		if err := launcher.Skip(ctx, "us-central1", zone); err != nil {
			gaps = append(gaps, launcher.Gap{Infra: "gcp", Region: "us-central1", Zone: zone, Err: err})
			continue
		}
		z.mu.Lock()
		z.asked[zone]++
		hang := z.hangB && zone == "us-central1-b"
		z.mu.Unlock()
		if hang {
			<-ctx.Done()
			gaps = append(gaps, launcher.Gap{Infra: "gcp", Region: "us-central1", Zone: zone, Err: fmt.Errorf("%w: %w", launcher.ErrUnavailable, ctx.Err())})
			continue
		}
		out = append(out, running("gcp", "gcp/"+zone+"/svc-"+zone, svcLabels))
	}
	return out, launcher.PartialList(gaps)
}

func (z *zonal) Locate(id string) (string, string) {
	parts := strings.Split(id, "/")
	return "us-central1", parts[1]
}

func (z *zonal) Terminate(_ context.Context, id string) error {
	z.mu.Lock()
	defer z.mu.Unlock()
	if strings.Contains(id, "us-central1-b") && z.failB != nil {
		return z.failB
	}
	z.termed = append(z.termed, id)
	return nil
}

func (z *zonal) count(zone string) int {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.asked[zone]
}

// A hung zone costs one List its straggle wait; then its breaker is open and the next Lists
// skip it at once, reading the other zone; the infra stays up. Terminates in a failing zone
// are charged to that zone, never to the whole infra.
func TestAHungZoneIsSkippedAndChargedToItself(t *testing.T) {
	p, _ := newLive(t, nil)
	z := &zonal{asked: map[string]int{}, hangB: true}
	p.infras["gcp"] = z
	got, err := p.ListIn(context.Background(), []string{"gcp"}, svcLabels)
	if gaps, _ := launcher.Partial(err); len(gaps) != 1 || len(got) != 0 {
		t.Fatalf("first List = %v, %v; want the straggling infra as a gap", got, err)
	}
	eventually(t, 5*time.Second, "zone b's breaker open after its timeout", func() bool {
		return p.Health().State("gcp", "us-central1-b").State == StateDown
	})
	began := time.Now()
	got, err = p.ListIn(context.Background(), []string{"gcp"}, svcLabels)
	gaps, _ := launcher.Partial(err)
	if time.Since(began) > 500*time.Millisecond || len(gaps) != 1 || gaps[0].Zone != "us-central1-b" || len(got) != 1 {
		t.Fatalf("List with zone b down took %v: %v, %v; want zone a's instance and zone b skipped at once", time.Since(began), got, err)
	}
	if n := z.count("us-central1-b"); n != 1 {
		t.Fatalf("zone b asked %d times, want once (then skipped)", n)
	}
	if s := p.Health().State("gcp", ""); s.State != StateUp {
		t.Fatalf("the infra %+v, want up: one zone failed", s)
	}
	// Terminates in zone b are left behind without a call; the infra stays up.
	for i := range 4 {
		err := p.Terminate(context.Background(), fmt.Sprintf("gcp/us-central1-b/vm-%d", i))
		if _, left := launcher.LeftBehind(err); !left {
			t.Fatalf("terminate in the down zone: %v, want left behind", err)
		}
	}
	z.mu.Lock()
	z.hangB = false
	z.failB = fmt.Errorf("%w: 503", launcher.ErrUnavailable)
	z.mu.Unlock()
	p.Health().Observe("gcp", "us-central1-b", nil) // as a probe would
	for i := range 4 {
		_ = p.Terminate(context.Background(), fmt.Sprintf("gcp/us-central1-b/vm-%d", i))
	}
	if s := p.Health().State("gcp", ""); s.State != StateUp {
		t.Fatalf("the infra after 4 failing terminates in one zone: %+v, want up", s)
	}
	if s := p.Health().State("gcp", "us-central1-b"); s.State != StateDown {
		t.Fatalf("zone b after 4 failing terminates: %+v, want down", s)
	}
	if err := p.Terminate(context.Background(), "gcp/us-central1-a/vm-ok"); err != nil {
		t.Fatalf("terminate in the healthy zone: %v", err)
	}
}

// panicky lists by panicking.
type panicky struct{ scripted }

func (*panicky) List(context.Context, map[string]string) ([]launcher.Instance, error) {
	panic("provider bug")
}

func TestAPanickingListIsAGap(t *testing.T) {
	p, provs := newLive(t, nil)
	p.infras["aws"] = &panicky{}
	provs[configs.InfraLocal].insts = []launcher.Instance{running("local", "local-svc-1", svcLabels)}
	got, err := p.List(context.Background(), svcLabels)
	gaps, partial := launcher.Partial(err)
	if !partial || len(gaps) != 1 || gaps[0].Infra != "aws" || !strings.Contains(gaps[0].Err.Error(), "panicked") || len(got) != 1 {
		t.Fatalf("List = %v, %v; want the local instance and aws a gap", got, err)
	}
}

// flakyLedger fails its first puts.
type flakyLedger struct {
	memLedger
	failPuts int
}

func (l *flakyLedger) PutLeftover(x launcher.Leftover) error {
	l.mu.Lock()
	if l.failPuts > 0 {
		l.failPuts--
		l.mu.Unlock()
		return errors.New("disk full")
	}
	l.mu.Unlock()
	return l.memLedger.PutLeftover(x)
}

// A leftover the store could not take is kept and written at a later sweep.
func TestLeftoverWrittenOnceTheStoreTakesIt(t *testing.T) {
	p, provs := newLive(t, nil)
	provs["gcp"].termErr = fmt.Errorf("%w: 503", launcher.ErrUnavailable)
	ledger := &flakyLedger{failPuts: 1}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = p.Run(ctx, ledger)
	}()
	defer func() { cancel(); <-done }()
	eventually(t, 5*time.Second, "the janitor open", func() bool {
		p.janitor.mu.Lock()
		defer p.janitor.mu.Unlock()
		return p.janitor.ledger != nil
	})
	err := p.Terminate(context.Background(), "gcp/us-central1-a/svc-1")
	left, ok := launcher.LeftBehind(err)
	if !ok || left.Key == "" || left.Since.IsZero() {
		t.Fatalf("Terminate = %v; want it left behind, with its key and since", err)
	}
	if ledger.len() != 0 {
		t.Fatal("the failing put stored it")
	}
	eventually(t, 5*time.Second, "the leftover written at a later sweep", func() bool { return ledger.len() == 1 })
}
