package leader

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/ferryserve/ferry/internal/testcluster"
)

func TestMain(m *testing.M) { testcluster.Main(m) }

// eventually polls cond until it holds or a generous deadline passes (no timing asserted).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestTakeoverMovesTheTerm runs two candidates on one Lease of the real API server: the first
// leads with term 0 and writes its URL on the Lease, which the second reads; when the first
// stops (it releases the Lease), the second takes over with term 1, and the first's Term is no
// longer ok. A holder killed outright is e2e's TestHAControllerFailover.
func TestTakeoverMovesTheTerm(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	ns := "leader-takeover"
	if _, err := c.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := func(id string) Config {
		return Config{Client: c.Client().CoordinationV1(), Namespace: ns, Name: DefaultLeaseName, Identity: id,
			URL: "http://" + id + ".invalid", LeaseDuration: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 300 * time.Millisecond}
	}
	a, err := New(cfg("a"))
	if err != nil {
		t.Fatal(err)
	}
	aCtx, killA := context.WithCancel(ctx)
	aLed := make(chan struct{})
	aDone := make(chan error, 1)
	go func() { aDone <- a.Run(aCtx, Callbacks{OnStartedLeading: func(context.Context) { close(aLed) }}) }()
	<-aLed
	if term, holder, ok := a.Term(); term != 0 || holder != "a" || !ok {
		t.Fatalf("a's Term = %d, %q, %v; want 0, a, true", term, holder, ok)
	}

	b, err := New(cfg("b"))
	if err != nil {
		t.Fatal(err)
	}
	bCtx, stopB := context.WithCancel(ctx)
	defer stopB()
	bLed := make(chan struct{})
	bDone := make(chan error, 1)
	go func() { bDone <- b.Run(bCtx, Callbacks{OnStartedLeading: func(context.Context) { close(bLed) }}) }()
	eventually(t, "b to see a lead", func() bool {
		id, url, err := b.Leader(ctx)
		return err == nil && id == "a" && url == "http://a.invalid"
	})
	if _, _, ok := b.Term(); ok {
		t.Fatal("b's Term is ok while a leads")
	}

	killA()
	if err := <-aDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("a.Run after its context ended = %v, want context.Canceled", err)
	}
	<-bLed
	if _, _, ok := a.Term(); ok {
		t.Fatal("a's Term still ok after it stopped")
	}
	if term, holder, ok := b.Term(); term != 1 || holder != "b" || !ok {
		t.Fatalf("b's Term = %d, %q, %v; want 1, b, true", term, holder, ok)
	}
	lease, err := c.Client().CoordinationV1().Leases(ns).Get(ctx, DefaultLeaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := lease.Annotations[AnnotationURL]; got != "http://b.invalid" || *lease.Spec.HolderIdentity != "b" || *lease.Spec.LeaseTransitions != 1 {
		t.Fatalf("lease after takeover: holder %q, transitions %d, url %q", *lease.Spec.HolderIdentity, *lease.Spec.LeaseTransitions, got)
	}
	stopB()
	if err := <-bDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("b.Run = %v", err)
	}
}

// TestLosingTheLeaseEndsRunWithErrLost takes the Lease away from its holder behind its back (as
// another controller that judged it expired would) and checks Run returns ErrLost, the
// leader-only context ends, and Term stops being ok.
func TestLosingTheLeaseEndsRunWithErrLost(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	ns := "leader-lost"
	if _, err := c.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{Client: c.Client().CoordinationV1(), Namespace: ns, Name: "l", Identity: "me",
		LeaseDuration: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	leaderCtx := make(chan context.Context, 1)
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx, Callbacks{OnStartedLeading: func(c context.Context) { leaderCtx <- c }}) }()
	lctx := <-leaderCtx
	eventually(t, "someone else to hold the lease", func() bool {
		leases := c.Client().CoordinationV1().Leases(ns)
		lease, err := leases.Get(ctx, "l", metav1.GetOptions{})
		if err != nil {
			return false
		}
		other := "other"
		lease.Spec.HolderIdentity = &other
		_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
		return err == nil
	})
	if err := <-done; !errors.Is(err, ErrLost) {
		t.Fatalf("Run = %v, want ErrLost", err)
	}
	<-lctx.Done()
	if _, _, ok := e.Term(); ok {
		t.Fatal("Term ok after leadership was lost")
	}
}

// TestTermInDoubt: Term is ok only while the last renewal by this identity is younger than the
// renew deadline, and not after a write that gave the Lease away (the release).
func TestTermInDoubt(t *testing.T) {
	e, err := New(Config{Client: fakeLeases{}, Namespace: "ns", Name: "l", Identity: "me"})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, ok := e.Term(); ok {
		t.Fatal("ok before any write")
	}
	mine := rl.LeaderElectionRecord{HolderIdentity: "me", LeaderTransitions: 4}
	e.wrote(time.Now(), mine)
	if term, holder, ok := e.Term(); term != 4 || holder != "me" || !ok {
		t.Fatalf("after a renewal: %d, %q, %v; want 4, me, true", term, holder, ok)
	}
	e.wrote(time.Now().Add(-DefaultRenewDeadline-time.Second), mine)
	if _, _, ok := e.Term(); ok {
		t.Fatal("ok with the last renewal older than the renew deadline")
	}
	e.wrote(time.Now(), mine)
	e.wrote(time.Now(), rl.LeaderElectionRecord{LeaderTransitions: 4}) // released
	if _, _, ok := e.Term(); ok {
		t.Fatal("ok after the Lease was released")
	}
}

// fakeLeases satisfies Config.Client for tests that never reach the API server.
type fakeLeases struct{}

func (fakeLeases) Leases(string) coordinationclient.LeaseInterface { return nil }
