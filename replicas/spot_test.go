package replicas

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/policy"
)

// TestManagerSpotMix runs SkyServe's dynamic on-demand fallback with SpotHedge spreading: while
// spot replicas are not READY, on-demand ones cover them; once spot is READY the on-demand ones
// go; a preempted spot replica is reported to the provider (which avoids its zone), replaced,
// and covered by on-demand again meanwhile.
func TestManagerSpotMix(t *testing.T) {
	h, prov, kinds := spotMixHarness(t)
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
	spotIDs := readySpot(t, h, prov)

	// One spot replica is preempted.
	victim := spotIDs[0]
	prov.end(victim, launcher.StatePreempted, "spot reclaimed")
	// The fallback covers the shortfall and one more (policy.Split): two on-demand launches.
	eventually(t, "the preemption is reported, and a spot and two on-demand replicas are launched", func() bool {
		prov.mu.Lock()
		reported := len(prov.preempted) == 1 && prov.preempted[0].Labels[launcher.LabelReplicaID] != ""
		prov.mu.Unlock()
		spot, onDemand := kinds()
		return reported && len(spot) == 3 && len(onDemand) == 4
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
	h.m.SetDesired(1)
	h.start()
	h.waitReady(1)

	moved := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	t.Cleanup(moved.Close)
	fi := prov.byReplica(1)
	prov.mu.Lock()
	fi.inst.Endpoint = moved.Listener.Addr().String()
	prov.mu.Unlock()

	eventually(t, "READY at the new address, in memory and on disk", func() bool {
		eps := h.m.Ready()
		stored, ok := h.store.get("svc", 1)
		return len(eps) == 1 && eps[0].Addr == moved.Listener.Addr().String() && h.record(1).Endpoint == moved.Listener.Addr().String() &&
			ok && stored.Endpoint == moved.Listener.Addr().String() && stored.Status == StatusReady
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

// spotMixHarness starts a manager for 2 spot replicas with dynamic on-demand fallback whose
// instances answer 503 until made healthy; kinds returns the specs launched so far by kind.
func spotMixHarness(t *testing.T) (h *harness, prov *fakeProvider, kinds func() (spot, onDemand []launcher.Spec)) {
	return spotMixHarnessWith(t, nil)
}

// spotMixHarnessWith is spotMixHarness with the provider's zone function (fakeProvider.zone).
func spotMixHarnessWith(t *testing.T, zone func(launcher.Spec) (string, error)) (h *harness, prov *fakeProvider, kinds func() (spot, onDemand []launcher.Spec)) {
	prov = newFakeProvider(t)
	prov.unhealthyAtStart = true
	prov.zone = zone
	h = newHarness(t, prov, newFakeStore(), newFakeClock(), func(c *Config) {
		task := testTask()
		task.Resources.UseSpot = true
		task.Service.ReplicaPolicy = configs.ReplicaPolicy{MinReplicas: 2, MaxReplicas: 2,
			DynamicOndemandFallback: true, SpotPlacer: configs.SpotPlacerDynamicFallback}
		c.Task = task
	})
	h.m.SetDesired(2)
	h.start()
	kinds = func() (spot, onDemand []launcher.Spec) {
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
	return h, prov, kinds
}

// readySpot makes every spot replica healthy and waits until only they are left, READY; it
// returns their ids.
func readySpot(t *testing.T, h *harness, prov *fakeProvider) []int {
	t.Helper()
	var ids []int
	for _, r := range h.m.Replicas() {
		if r.Spot && live(r.Status) {
			ids = append(ids, r.ID)
			prov.byReplica(r.ID).healthy.Store(true)
		}
	}
	eventually(t, "only the spot replicas are left, READY", func() bool {
		n := 0
		for _, r := range h.m.Replicas() {
			if live(r.Status) {
				if !r.Spot || r.Status != StatusReady {
					return false
				}
				n++
			}
		}
		return n == len(ids)
	})
	return ids
}

// TestManagerReplacesNoticedReplica: a spot interruption notice for a READY replica starts its
// replacement and the on-demand fallback at once, reports the zone to the provider, and keeps
// the noticed replica serving (READY, published, not terminated) until the replacement is
// READY; then it drains and is terminated, the fallback leaves, and nothing more is launched.
func TestManagerReplacesNoticedReplica(t *testing.T) {
	h, prov, kinds := spotMixHarness(t)
	eventually(t, "2 spot and 2 fallback on-demand launches", func() bool {
		spot, onDemand := kinds()
		return len(spot) == 2 && len(onDemand) == 2
	})
	victim := readySpot(t, h, prov)[0]
	inst := h.record(victim).InstanceID
	if h.m.Notice("not-ours", time.Now()) {
		t.Error("Notice of an unknown instance reported it as this service's")
	}
	if !h.m.Notice(inst, h.clock.Now().Add(2*time.Minute)) {
		t.Fatalf("Notice(%s) of replica %d: not recognised", inst, victim)
	}
	h.m.Notice(inst, h.clock.Now().Add(2*time.Minute)) // a repeated notice changes nothing
	eventually(t, "a spot replacement and the on-demand fallback (shortfall and one more) launched, the zone reported", func() bool {
		prov.mu.Lock()
		reported := len(prov.preempted) == 1 && prov.preempted[0].ID == inst
		prov.mu.Unlock()
		spot, onDemand := kinds()
		return reported && len(spot) == 3 && len(onDemand) == 4
	})
	if got := h.status(victim); got != StatusReady {
		t.Errorf("noticed replica %d is %s; want READY until its instance goes", victim, got)
	}
	if !slices.Contains(ids(h.m.Ready()), victim) {
		t.Errorf("noticed replica %d left the READY set %v; it serves until reclaimed", victim, ids(h.m.Ready()))
	}
	prov.mu.Lock()
	terminated := slices.Contains(prov.terminated, inst)
	prov.mu.Unlock()
	if terminated {
		t.Errorf("the manager terminated the noticed instance %s itself", inst)
	}

	// The replacement turns READY before the reclaim: the warned replica leaves the READY set
	// and, drained, is terminated; the fallback goes; nothing more is launched.
	prov.byReplica(newestSpot(h, victim)).healthy.Store(true)
	eventually(t, "the warned replica terminated once its replacement serves", func() bool {
		prov.mu.Lock()
		defer prov.mu.Unlock()
		return slices.Contains(prov.terminated, inst)
	})
	readySpot(t, h, prov)
	if slices.Contains(ids(h.m.Ready()), victim) {
		t.Errorf("the warned replica %d is still published", victim)
	}
	spot, onDemand := kinds()
	if len(spot) != 3 || len(onDemand) != 4 {
		t.Errorf("%d spot and %d on-demand launches; want 3 and 4 (no second replacement)", len(spot), len(onDemand))
	}
}

// newestSpot is the id of the newest live spot replica other than except.
func newestSpot(h *harness, except int) int {
	id := 0
	for _, r := range h.m.Replicas() {
		if r.Spot && live(r.Status) && r.ID != except && r.ID > id {
			id = r.ID
		}
	}
	return id
}

func TestMixFor(t *testing.T) {
	got := MixFor(configs.Resources{UseSpot: true}, configs.ReplicaPolicy{BaseOndemandFallbackReplicas: 2, DynamicOndemandFallback: true})
	if want := (policy.MixSpec{UseSpot: true, BaseOnDemand: 2, DynamicFallback: true}); got != want {
		t.Errorf("MixFor = %+v, want %+v", got, want)
	}
}

// TestManagerCountsSpotLosses: a notice and a preemption of a spot replica are each a loss,
// named by where the replica ran; the preemption of a replica noticed before is not a second
// one, nor is a repeated notice.
func TestManagerCountsSpotLosses(t *testing.T) {
	h, prov, kinds := spotMixHarness(t)
	eventually(t, "2 spot and 2 fallback on-demand launches", func() bool {
		spot, onDemand := kinds()
		return len(spot) == 2 && len(onDemand) == 2
	})
	spotIDs := readySpot(t, h, prov)
	noticed, other := spotIDs[0], spotIDs[1]
	lost := func() int { return h.m.SpotLosses().Zones["fake"].Count }

	inst := h.record(noticed).InstanceID
	h.m.Notice(inst, h.clock.Now().Add(2*time.Minute))
	h.m.Notice(inst, h.clock.Now().Add(2*time.Minute))
	if n := lost(); n != 1 {
		t.Fatalf("%d losses after a notice (twice), want 1: %+v", n, h.m.SpotLosses())
	}
	prov.end(noticed, launcher.StatePreempted, "spot reclaimed")
	h.waitStatus(noticed, StatusPreempted)
	if n := lost(); n != 1 {
		t.Errorf("%d losses after the noticed replica's preemption, want still 1", n)
	}
	prov.end(other, launcher.StatePreempted, "spot reclaimed")
	h.waitStatus(other, StatusPreempted)
	if n := lost(); n != 2 {
		t.Errorf("%d losses after a second replica's preemption, want 2", n)
	}
}

// TestManagerRunsASpareWhileAZoneSitsAtItsCeiling: a reclaim that leaves some of the service's
// spot replicas in their zone shows the zone holds no more than that (policy.Losses.Capped).
// While the zone holds that many or more the service runs a spare spot replica
// (policy.Split), for a day after the ceiling was seen.
func TestManagerRunsASpareWhileAZoneSitsAtItsCeiling(t *testing.T) {
	h, prov, _ := spotMixHarnessWith(t, func(launcher.Spec) (string, error) { return "a", nil })
	eventually(t, "2 spot replicas launched", func() bool { return h.launchedSpot() == 2 })
	spotIDs := readySpot(t, h, prov)
	if n := h.m.SpotLosses().Zones["a"].Ceiling; n != 0 {
		t.Fatalf("ceiling %d in zone a before any loss, want none", n)
	}

	// Zone a takes one back and keeps the other.
	prov.end(spotIDs[0], launcher.StatePreempted, "spot reclaimed")
	h.waitStatus(spotIDs[0], StatusPreempted)
	if z := h.m.SpotLosses().Zones["a"]; z.Ceiling != 1 || z.CeilingAt.IsZero() || z.Count != 1 {
		t.Fatalf("zone a %+v after a reclaim that left one: want ceiling 1 and one loss", z)
	}
	eventually(t, "3 spot replicas READY (the target and the spare), no on-demand", func() bool {
		markSpotHealthy(h, prov)
		return len(h.liveKinds(true)) == 3 && len(h.liveKinds(false)) == 0 && len(h.m.Ready()) == 3 && h.m.SpotSpare() == 1
	})

	// A day after the ceiling was seen the spare goes.
	h.clock.Advance(policy.HoldLookback + time.Minute)
	eventually(t, "the spare scaled down a day later", func() bool {
		return len(h.liveKinds(true)) == 2 && len(h.liveKinds(false)) == 0 && h.m.SpotSpare() == 0
	})
}

// TestManagerRunsASpareAfterASpotLaunchNoZoneTook: a spot launch that every zone refused for
// capacity (launcher.ErrCapacityRefused) shows each zone holds no more of the service's spot
// replicas than it does then. On-demand stands in for the spare while spot cannot take it.
func TestManagerRunsASpareAfterASpotLaunchNoZoneTook(t *testing.T) {
	var refuse atomic.Bool
	h, prov, _ := spotMixHarnessWith(t, refusingSpot(&refuse))
	eventually(t, "2 spot replicas launched", func() bool { return h.launchedSpot() == 2 })
	readySpot(t, h, prov)

	// The service wants a third replica; no zone takes it on spot.
	refuse.Store(true)
	h.m.SetDesired(3)
	eventually(t, "zone a's ceiling of 2, seen at the refused launch", func() bool {
		z := h.m.SpotLosses().Zones["a"]
		return z.Ceiling == 2 && z.Count == 0
	})
	// Spot READY: 2 of the 3 wanted, and the spare: on-demand covers both.
	eventually(t, "two on-demand replicas READY while spot is one short of the target and the spare", func() bool {
		markOnDemandHealthy(h, prov)
		return len(h.liveKinds(false)) == 2 && len(h.m.Ready()) == 4
	})
	// Spot capacity comes back: the third replica and the spare run on spot, and on-demand
	// leaves.
	refuse.Store(false)
	h.clock.Advance(launchBackoff(10))
	eventually(t, "4 spot replicas READY (the target and the spare), no on-demand", func() bool {
		markSpotHealthy(h, prov)
		return len(h.liveKinds(true)) == 4 && len(h.liveKinds(false)) == 0 && len(h.m.Ready()) == 4 && h.m.SpotSpare() == 1
	})
}

// TestManagerLaunchesAMissingSpareOnSpotFirst: with the target's spot replicas READY, a
// spare the next loss took is replaced on spot alone (an on-demand stand-in launched beside it
// would come READY with it and serve nothing); on-demand stands in only once a spot launch
// has failed (policy.Spare.SpotFailing).
func TestManagerLaunchesAMissingSpareOnSpotFirst(t *testing.T) {
	var refuse atomic.Bool
	h, prov, kinds := spotMixHarnessWith(t, refusingSpot(&refuse))
	eventually(t, "2 spot replicas launched", func() bool { return h.launchedSpot() == 2 })
	spotIDs := readySpot(t, h, prov)
	onDemandLaunches := func() int { _, od := kinds(); return len(od) }

	// Zone a takes one back and keeps the other: a ceiling, and a spare from then on.
	prov.end(spotIDs[0], launcher.StatePreempted, "spot reclaimed")
	h.waitStatus(spotIDs[0], StatusPreempted)
	eventually(t, "3 spot replicas READY (the target and the spare), no on-demand", func() bool {
		markSpotHealthy(h, prov)
		return len(h.liveKinds(true)) == 3 && len(h.liveKinds(false)) == 0 && len(h.m.Ready()) == 3 && h.m.SpotSpare() == 1
	})
	before := onDemandLaunches()

	// The next loss takes what the spare stood for: the target stays READY on spot, and the
	// spare comes back on spot, with no on-demand beside it.
	lost := newestSpot(h, 0)
	prov.end(lost, launcher.StatePreempted, "spot reclaimed")
	h.waitStatus(lost, StatusPreempted)
	eventually(t, "3 spot replicas READY again", func() bool {
		markSpotHealthy(h, prov)
		return len(h.liveKinds(true)) == 3 && len(h.m.Ready()) == 3
	})
	if n := onDemandLaunches() - before; n != 0 {
		t.Fatalf("%d on-demand launches beside the spare's spot replacement, want none", n)
	}

	// Once a spot launch fails, on-demand stands in for the spare.
	refuse.Store(true)
	lost = newestSpot(h, 0)
	prov.end(lost, launcher.StatePreempted, "spot reclaimed")
	h.waitStatus(lost, StatusPreempted)
	eventually(t, "an on-demand stand-in READY after the spare's spot launch failed", func() bool {
		markOnDemandHealthy(h, prov)
		return onDemandLaunches()-before == 1 && len(h.liveKinds(false)) == 1 && len(h.m.Ready()) == 3
	})
}

// refusingSpot places every replica in zone a, but while refuse is set a spot launch fails as
// one every zone refused for capacity (launcher.ErrCapacityRefused).
func refusingSpot(refuse *atomic.Bool) func(launcher.Spec) (string, error) {
	return func(spec launcher.Spec) (string, error) {
		if spec.Labels[LabelKind] == kindSpot && refuse.Load() {
			return "", launcher.CapacityRefused(fmt.Errorf("%w: every location failed (2): a: no spot capacity; b: no spot capacity", launcher.ErrNoCapacity))
		}
		return "a", nil
	}
}

// launchedSpot counts the live spot replicas that hold an instance.
func (h *harness) launchedSpot() int {
	n := 0
	for _, r := range h.m.Replicas() {
		if r.Spot && live(r.Status) && r.InstanceID != "" {
			n++
		}
	}
	return n
}

// markSpotHealthy makes every live spot replica with an instance pass its probes.
func markSpotHealthy(h *harness, prov *fakeProvider) { markHealthy(h, prov, true) }

// markOnDemandHealthy is markSpotHealthy for the on-demand replicas.
func markOnDemandHealthy(h *harness, prov *fakeProvider) { markHealthy(h, prov, false) }

func markHealthy(h *harness, prov *fakeProvider, spot bool) {
	for _, r := range h.m.Replicas() {
		if r.Spot == spot && live(r.Status) && r.InstanceID != "" {
			prov.byReplica(r.ID).healthy.Store(true)
		}
	}
}

// liveKinds are the ids of the live replicas of one kind (spot or on-demand).
func (h *harness) liveKinds(spot bool) []int {
	var ids []int
	for _, r := range h.m.Replicas() {
		if r.Spot == spot && live(r.Status) {
			ids = append(ids, r.ID)
		}
	}
	return ids
}
