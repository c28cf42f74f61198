package replicas

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ferryserve/ferry/launcher"
)

// An infra that cannot be listed is unknown, not gone (issue 32): the replicas on it keep
// serving while their probes pass, nothing is replaced, and work on other infras goes on.

var fakeDown = launcher.Gap{Infra: "fake", Err: fmt.Errorf("%w: 503 backendError", launcher.ErrUnavailable)}

func TestManagerKeepsReplicasOnAnInfraThatCannotBeListed(t *testing.T) {
	h := newHarness(t, newFakeProvider(t), newFakeStore(), newFakeClock())
	h.start()
	h.m.SetDesired(2)
	h.waitReady(1, 2)
	h.prov.setGaps(fakeDown)
	n := h.prov.listCount()
	eventually(t, "several Lists with the infra down", func() bool { return h.prov.listCount() >= n+5 })
	h.waitReady(1, 2)
	if got := h.m.Unknown(); len(got) != 1 || got[0].Infra != "fake" {
		t.Fatalf("Unknown() = %v, want the fake infra", got)
	}
	h.prov.mu.Lock()
	launches, terminated := len(h.prov.specs), len(h.prov.terminated)
	h.prov.mu.Unlock()
	if launches != 2 || terminated != 0 {
		t.Fatalf("with the infra unlisted: %d launches, %d terminations; want 2 and none", launches, terminated)
	}
	for _, id := range []int{1, 2} {
		if s := h.status(id); s != StatusReady {
			t.Fatalf("replica %d %s, want READY", id, s)
		}
	}
	// Its probes still decide: a replica that stops answering leaves the READY set.
	h.prov.byReplica(2).healthy.Store(false)
	h.waitReady(1)
	h.prov.byReplica(2).healthy.Store(true)
	h.waitReady(1, 2)
	h.prov.setGaps()
	eventually(t, "the gap forgotten once the infra answers", func() bool { return len(h.m.Unknown()) == 0 })
}

func TestManagerLaunchesWhileAnotherInfraCannotBeListed(t *testing.T) {
	prov := newFakeProvider(t)
	prov.setGaps(launcher.Gap{Infra: "gcp", Err: fmt.Errorf("%w: 503", launcher.ErrUnavailable)})
	h := newHarness(t, prov, newFakeStore(), newFakeClock())
	h.start()
	h.m.SetDesired(2)
	h.waitReady(1, 2) // before issue 32 the manager never observed, and never launched
}

func TestManagerRestartedWhileItsInfraIsDownKeepsItsReplicas(t *testing.T) {
	prov, store, clock := newFakeProvider(t), newFakeStore(), newFakeClock()
	first := newHarness(t, prov, store, clock)
	first.start()
	first.m.SetDesired(2)
	first.waitReady(1, 2)
	first.stop()

	prov.setGaps(fakeDown)
	second := newHarness(t, prov, store, clock)
	second.start()
	second.waitReady(1, 2)
	time.Sleep(200 * time.Millisecond) // ten reconcile intervals, in which nothing may be replaced
	prov.mu.Lock()
	launches, terminated := len(prov.specs), len(prov.terminated)
	prov.mu.Unlock()
	if launches != 2 || terminated != 0 {
		t.Fatalf("restarted with the infra down: %d launches, %d terminations; want 2 and none", launches, terminated)
	}
	second.waitReady(1, 2)
}

func TestManagerShutdownLeavesWhatItCannotReach(t *testing.T) {
	h := newHarness(t, newFakeProvider(t), newFakeStore(), newFakeClock())
	h.start()
	h.m.SetDesired(2)
	h.waitReady(1, 2)
	insts := []string{h.record(1).InstanceID, h.record(2).InstanceID}
	h.prov.setGaps(fakeDown)
	left, err := h.m.Shutdown(context.Background())
	if err != nil {
		t.Fatalf("Shutdown with the infra down: %v, want success with leftovers", err)
	}
	var ids []string
	var selectors int
	for _, l := range left {
		switch {
		case l.InstanceID != "":
			ids = append(ids, l.InstanceID)
		case l.Selector[launcher.LabelService] == "svc" && !l.Before.IsZero():
			selectors++
		}
		if l.Infra != "fake" || l.Owner != "service svc" || l.Reason == "" || l.Key == "" {
			t.Errorf("leftover %+v: want infra, owner, reason and key", l)
		}
	}
	slices.Sort(ids)
	slices.Sort(insts)
	if !slices.Equal(ids, insts) || selectors != 1 {
		t.Fatalf("left behind %+v; want instances %v and one selector for the rest", left, insts)
	}
	if kept := h.prov.Leftovers(); len(kept) != len(left) {
		t.Fatalf("the provider keeps %d leftovers, Shutdown reported %d", len(kept), len(left))
	}
	if recs, _ := h.store.ListReplicas("svc"); len(recs) != 0 {
		t.Fatalf("%d records after Shutdown", len(recs))
	}
}
