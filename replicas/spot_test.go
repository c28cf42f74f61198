package replicas

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ferryserve/ferry/autoscaler"
	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// TestManagerSpotMix runs SkyServe's dynamic on-demand fallback with SpotHedge spreading: while
// spot replicas are not READY, on-demand ones cover them; once spot is READY the on-demand ones
// go; a preempted spot replica is reported to the provider (which avoids its zone), replaced,
// and covered by on-demand again meanwhile.
func TestManagerSpotMix(t *testing.T) {
	prov := newFakeProvider(t)
	prov.unhealthyAtStart = true
	h := newHarness(t, prov, newFakeStore(), newFakeClock(), func(c *Config) {
		task := testTask()
		task.Resources.UseSpot = true
		task.Service.ReplicaPolicy = configs.ReplicaPolicy{MinReplicas: 2, MaxReplicas: 2,
			DynamicOndemandFallback: true, SpotPlacer: configs.SpotPlacerDynamicFallback}
		c.Task = task
		c.Mix = autoscaler.MixFor(task.Resources, task.Service.ReplicaPolicy)
	})
	h.m.SetTarget(2)
	h.start()

	kinds := func() (spot, onDemand []launcher.Spec) {
		prov.mu.Lock()
		defer prov.mu.Unlock()
		for _, s := range prov.specs {
			if s.Labels[LabelKind] == kindSpot {
				spot = append(spot, s)
			} else {
				onDemand = append(onDemand, s)
			}
		}
		return spot, onDemand
	}
	eventually(t, "2 spot and 2 fallback on-demand launches", func() bool {
		spot, onDemand := kinds()
		return len(spot) == 2 && len(onDemand) == 2
	})
	spot, onDemand := kinds()
	for _, s := range spot {
		if !s.Resources.UseSpot || s.Spread == nil {
			t.Errorf("spot replica %s: use_spot %v, spread %v; want spot capacity, spread over zones", s.Name, s.Resources.UseSpot, s.Spread)
		}
	}
	for _, s := range onDemand {
		if s.Resources.UseSpot || s.Spread != nil {
			t.Errorf("on-demand replica %s: use_spot %v, spread %v", s.Name, s.Resources.UseSpot, s.Spread)
		}
	}

	// Spot replicas become READY: the fallback on-demand replicas leave.
	spotIDs := map[int]bool{}
	for _, r := range h.m.Replicas() {
		if r.Spot {
			spotIDs[r.ID] = true
			prov.byReplica(r.ID).healthy.Store(true)
		}
	}
	eventually(t, "only the 2 spot replicas are left, READY", func() bool {
		n := 0
		for _, r := range h.m.Replicas() {
			if live(r.Status) {
				if !r.Spot || r.Status != StatusReady {
					return false
				}
				n++
			}
		}
		return n == 2
	})

	// One spot replica is preempted.
	var victim int
	for id := range spotIDs {
		victim = id
		break
	}
	prov.end(victim, launcher.StatePreempted, "spot reclaimed")
	eventually(t, "the preemption is reported, and a spot and an on-demand replica are launched", func() bool {
		prov.mu.Lock()
		reported := len(prov.preempted) == 1 && prov.preempted[0].Labels[launcher.LabelReplicaID] != ""
		prov.mu.Unlock()
		spot, onDemand := kinds()
		return reported && len(spot) == 3 && len(onDemand) == 3
	})
	if h.status(victim) != StatusPreempted {
		t.Errorf("victim %d is %s, want PREEMPTED", victim, h.status(victim))
	}
}

// TestManagerFollowsAnEndpointChange: an instance that comes back on another address (a VM
// restarted with a new IP) leaves the READY set until a probe of the new address passes, and
// is then published there.
func TestManagerFollowsAnEndpointChange(t *testing.T) {
	prov := newFakeProvider(t)
	h := newHarness(t, prov, newFakeStore(), newFakeClock())
	h.m.SetTarget(1)
	h.start()
	h.waitReady(1)

	moved := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	t.Cleanup(moved.Close)
	fi := prov.byReplica(1)
	prov.mu.Lock()
	fi.inst.Endpoint = moved.Listener.Addr().String()
	prov.mu.Unlock()

	eventually(t, "READY at the new address", func() bool {
		eps := h.m.Ready()
		return len(eps) == 1 && eps[0].Addr == moved.Listener.Addr().String() && h.record(1).Endpoint == moved.Listener.Addr().String()
	})
	saw := false
	for _, e := range h.logs.FilterMessage("replica status").All() {
		for _, f := range e.Context {
			if f.Key == "reason" && strings.HasPrefix(f.String, "endpoint changed") {
				saw = true
			}
		}
	}
	if !saw {
		t.Error("no NOT_READY transition for the endpoint change in the log")
	}
}
