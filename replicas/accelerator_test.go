package replicas

import (
	"context"
	"sync"
	"testing"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// placing is a provider whose launches land on accelerators in turn, as the provisioner
// reports a placement among the task's alternatives; its List does not know them.
type placing struct {
	*fakeProvider
	mu   sync.Mutex
	accs []string
	n    int
}

func (p *placing) Launch(ctx context.Context, spec launcher.Spec) (launcher.Instance, error) {
	inst, err := p.fakeProvider.Launch(ctx, spec)
	p.mu.Lock()
	inst.Accelerator = p.accs[p.n%len(p.accs)]
	p.n++
	p.mu.Unlock()
	return inst, err
}

// A task whose accelerators are alternatives publishes each READY replica with the accelerator
// it was placed on, which instance_aware_least_load weighs it by.
func TestReadyCarriesPlacedAccelerator(t *testing.T) {
	prov := &placing{fakeProvider: newFakeProvider(t), accs: []string{"L4", "H100"}}
	h := newHarness(t, prov.fakeProvider, newFakeStore(), newFakeClock(), func(c *Config) {
		c.Provider = prov
		c.Task.Resources = configs.Resources{Accelerators: []configs.Accelerator{{Name: "L4", Count: 1}, {Name: "H100", Count: 1}}}
	})
	h.start()
	h.m.SetDesired(2)
	h.waitReady(1, 2)
	// Launches run concurrently, so which replica got which is not fixed: each has its own,
	// both types appear, and the record (kept across the provider's List) agrees.
	seen := map[string]bool{}
	for _, e := range h.m.Ready() {
		seen[e.Accelerator] = true
		if rec := h.record(e.ReplicaID); rec.Accelerator != e.Accelerator {
			t.Errorf("replica %d: record says %q, endpoint %q", e.ReplicaID, rec.Accelerator, e.Accelerator)
		}
	}
	if !seen["L4"] || !seen["H100"] {
		t.Errorf("published accelerators %v, want L4 and H100 (not the task's \"\" for alternatives)", seen)
	}
}

// A service whose alternatives mix spot and on-demand under a per-work objective launches them
// as written; without one, a replica's kind still decides every alternative's pricing.
func TestWithSpotKeepsAMixedObjective(t *testing.T) {
	mixed := configs.Resources{Objective: configs.Objective{Minimize: configs.ObjectiveCostPerToken},
		AnyOf: []configs.Resources{{UseSpot: true, Accelerators: []configs.Accelerator{{Name: "L4", Count: 1}}}, {Accelerators: []configs.Accelerator{{Name: "A100", Count: 1}}}}}
	got := withSpot(mixed, false)
	if !got.AnyOf[0].UseSpot || got.AnyOf[1].UseSpot {
		t.Errorf("per-work objective: alternatives %v/%v, want spot/on-demand as written", got.AnyOf[0].UseSpot, got.AnyOf[1].UseSpot)
	}
	mixed.Objective = configs.Objective{}
	if got := withSpot(mixed, false); got.AnyOf[0].UseSpot {
		t.Error("cost_per_hour: the on-demand kind must make every alternative on-demand")
	}
}
