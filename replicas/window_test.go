package replicas

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/ferryserve/ferry/launcher"
)

// windowProvider puts the first replica it launches in a capacity block ending at end, as the
// provisioner reports an instance launched into a reservation; later ones run elsewhere.
type windowProvider struct {
	*fakeProvider
	end      time.Time
	launches int
}

func (w *windowProvider) Launch(ctx context.Context, spec launcher.Spec) (launcher.Instance, error) {
	inst, err := w.fakeProvider.Launch(ctx, spec)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.launches++
	if err == nil && w.launches == 1 {
		w.insts[inst.ID].inst.WindowEnd = w.end
		inst.WindowEnd = w.end
	}
	return inst, err
}

// TestManagerReplacesReplicaBeforeItsWindowEnds: a replica whose block ends is left alone
// until the lead before the end; then its replacement launches while it serves on, and it
// leaves the READY set only once the replacement is in it (never an empty set: no request
// finds no replica). The end is not a preemption: no zone is reported.
func TestManagerReplacesReplicaBeforeItsWindowEnds(t *testing.T) {
	for _, how := range []string{"instance window", "notice ahead"} {
		t.Run(how, func(t *testing.T) {
			clock := newFakeClock()
			end := clock.Now().Add(time.Hour)
			prov := &windowProvider{fakeProvider: newFakeProvider(t), end: end}
			if how == "notice ahead" {
				prov.end = time.Time{} // the provider says it through a Notice instead
			}
			prov.unhealthyAtStart = true
			h := newHarness(t, prov.fakeProvider, newFakeStore(), clock, func(c *Config) {
				c.Provider, c.WindowLead = prov, 10*time.Minute
			})
			h.m.SetDesired(1)
			h.start()
			eventually(t, "the first launch", func() bool { return prov.count() == 1 })
			prov.byReplica(1).healthy.Store(true)
			h.waitReady(1)
			old := h.record(1).InstanceID
			if how == "notice ahead" && !h.m.Notice(old, end) {
				t.Fatal("the window's notice was not taken as this service's")
			}

			// 11 minutes before the end, nothing moves (a few passes run meanwhile).
			clock.Advance(49 * time.Minute)
			time.Sleep(200 * time.Millisecond)
			if n := prov.count(); n != 1 {
				t.Fatalf("%d instances 11 minutes before the end; the lead is 10", n)
			}

			// Within the lead: the replacement launches; the old replica still serves.
			clock.Advance(2 * time.Minute)
			eventually(t, "the replacement launched", func() bool { return prov.count() == 2 })
			if got := ids(h.m.Ready()); !slices.Equal(got, []int{1}) {
				t.Fatalf("READY %v while the replacement starts, want [1]", got)
			}
			prov.byReplica(2).healthy.Store(true)
			eventually(t, "the old replica terminated", func() bool {
				prov.mu.Lock()
				defer prov.mu.Unlock()
				return slices.Contains(prov.terminated, old)
			})
			h.waitReady(2)
			seen := false
			for _, set := range h.pubs.all() {
				has1, has2 := slices.Contains(ids(set), 1), slices.Contains(ids(set), 2)
				seen = seen || has1
				if seen && !has1 && !has2 {
					t.Fatalf("a READY set without either replica was published: %v", h.pubs.all())
				}
			}
			prov.mu.Lock()
			defer prov.mu.Unlock()
			if len(prov.preempted) != 0 || prov.launches != 2 {
				t.Errorf("preempted %v, %d launches; want no zone reported and one replacement", prov.preempted, prov.launches)
			}
		})
	}
}
