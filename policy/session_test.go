package policy

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func sessionPicker(t *testing.T) Picker {
	t.Helper()
	p, err := New(SessionAffinity, Options{Rand: seeded(21)})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func sessionReq(key string) *Request { return &Request{SessionID: []byte(key)} }

func TestSessionAffinity(t *testing.T) {
	tests := map[string]struct {
		loads []int64
		key   string
		// overload sets the key's idle-time replica to this many in-flight requests first.
		overload int64
		// wantIDs are the replicas picked over many draws; wantIdle means "the replica the key
		// maps to when every replica is idle", wantNext "the one it maps to without that one".
		wantIDs  []int
		wantIdle bool
		wantNext bool
	}{
		"no session goes to least load": {loads: []int64{3, 0, 2}, wantIDs: []int{2}},
		"no session, ties at random":    {loads: []int64{1, 0, 0}, wantIDs: []int{2, 3}},
		"a session sticks":              {loads: []int64{0, 0, 0, 0, 0}, key: "chat-1", wantIdle: true},
		"sticks under load below bound": {loads: []int64{4, 4, 4, 4, 4}, key: "chat-1", overload: 5, wantIdle: true},
		// total 24, capacity ceil(1.25 × 25 / 5) = 7: the key's replica at 8 is skipped for the
		// key's next choice, which is where every such request goes.
		"over the bound goes to the next choice": {loads: []int64{4, 4, 4, 4, 4}, key: "chat-1", overload: 8, wantNext: true},
		"single replica over the bound":          {loads: []int64{9}, key: "chat-1", wantIDs: []int{1}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := sessionPicker(t)
			rs := replicas(tc.loads)
			want := tc.wantIDs
			if tc.wantIdle || tc.wantNext || tc.overload > 0 {
				idle := p.Pick(sessionReq(tc.key), replicas(make([]int64, len(tc.loads))))
				home := rs[idle.ID-1]
				if tc.overload > 0 {
					home.InFlight.Store(tc.overload)
				}
				if tc.wantIdle {
					want = []int{idle.ID}
				}
				if tc.wantNext {
					var others []*Replica
					for _, r := range rs {
						if r != home {
							others = append(others, r)
						}
					}
					want = []int{p.Pick(sessionReq(tc.key), others).ID}
				}
			}
			seen := map[int]bool{}
			for range 100 {
				seen[p.Pick(sessionReq(tc.key), rs).ID] = true
			}
			var got []int
			for id := range len(rs) + 1 {
				if seen[id] {
					got = append(got, id)
				}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("picked ids (-want +got):\n%s", diff)
			}
		})
	}
}

// homes maps each of keys sessions to the replica ID it picks among idle replicas.
func homes(p Picker, rs []*Replica, keys int) map[string]int {
	out := make(map[string]int, keys)
	for i := range keys {
		key := fmt.Sprintf("session-%d", i)
		out[key] = p.Pick(sessionReq(key), rs).ID
	}
	return out
}

func TestSessionAffinitySpreadsEvenly(t *testing.T) {
	const n, keys = 8, 16_000
	counts := map[int]int{}
	for _, id := range homes(sessionPicker(t), replicas(make([]int64, n)), keys) {
		counts[id]++
	}
	for id := 1; id <= n; id++ {
		if got := counts[id]; math.Abs(float64(got)-keys/n) > 0.1*keys/n {
			t.Errorf("replica %d is home to %d sessions, want %d ± 10%% (all: %v)", id, got, keys/n, counts)
		}
	}
}

// TestSessionAffinityMembershipChange: adding a replica moves about 1/n of the sessions, all of
// them to the new replica; removing one moves only the sessions it was home to.
func TestSessionAffinityMembershipChange(t *testing.T) {
	const keys = 9_000
	p := sessionPicker(t)
	eight := replicas(make([]int64, 8))
	before := homes(p, eight, keys)

	nine := append(eight[:8:8], &Replica{ID: 9, Addr: "10.0.0.1:8008"})
	moved := 0
	for key, id := range homes(p, nine, keys) {
		if id != before[key] {
			moved++
			if id != 9 {
				t.Fatalf("adding replica 9 moved %s from %d to %d", key, before[key], id)
			}
		}
	}
	if share := float64(moved) / keys; share < 0.8/9 || share > 1.2/9 {
		t.Errorf("adding a ninth replica moved %.3f of the sessions, want about 1/9 = %.3f", share, 1.0/9)
	}

	var seven []*Replica
	for _, r := range eight {
		if r.ID != 3 {
			seven = append(seven, r)
		}
	}
	for key, id := range homes(p, seven, keys) {
		if before[key] != 3 && id != before[key] {
			t.Fatalf("removing replica 3 moved %s from %d to %d", key, before[key], id)
		}
	}
}

// TestSessionAffinityRespectsTheBound checks on random snapshots that the pick is below the
// capacity ceil(1.25 × (total+1) / n), and is the session's idle-time home whenever that
// replica is.
func TestSessionAffinityRespectsTheBound(t *testing.T) {
	gen := rand.New(rand.NewPCG(1, 2))
	p := sessionPicker(t)
	for trial := range 3000 {
		loads := make([]int64, 1+gen.IntN(10))
		var total int64
		for i := range loads {
			loads[i] = int64(gen.IntN(8))
			total += loads[i]
		}
		rs := replicas(loads)
		key := fmt.Sprintf("k%d", gen.IntN(50))
		capacity := int64(math.Ceil(1.25 * float64(total+1) / float64(len(rs))))
		home := p.Pick(sessionReq(key), replicas(make([]int64, len(rs))))
		got := p.Pick(sessionReq(key), rs)
		if load := got.InFlight.Load(); load >= capacity {
			t.Fatalf("trial %d: loads %v: picked replica %d with load %d, capacity %d", trial, loads, got.ID, load, capacity)
		}
		if loads[home.ID-1] < capacity && got.ID != home.ID {
			t.Fatalf("trial %d: loads %v: home %d is under capacity %d but picked %d", trial, loads, home.ID, capacity, got.ID)
		}
	}
}

// TestSessionAffinityHotSession: one session sending many concurrent requests spreads over
// replicas within the bound instead of queueing on its home.
func TestSessionAffinityHotSession(t *testing.T) {
	p := sessionPicker(t)
	rs := replicas(make([]int64, 4))
	for i := range 40 {
		got := p.Pick(sessionReq("hot"), rs)
		got.InFlight.Add(1)
		capacity := int64(math.Ceil(1.25 * float64(i+1) / 4))
		for _, r := range rs {
			if r.InFlight.Load() > capacity {
				t.Fatalf("after %d requests replica %d holds %d, capacity %d", i+1, r.ID, r.InFlight.Load(), capacity)
			}
		}
	}
}
