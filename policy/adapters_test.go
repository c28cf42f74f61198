package policy

import (
	"testing"
	"time"
)

func TestAdaptersNumberNamesOnce(t *testing.T) {
	a := NewAdapters()
	if a.Lookup([]byte("x")) != 0 || a.Len() != 0 {
		t.Fatal("an empty table knows a name")
	}
	if !a.Add("sql", "chat", "sql", "") {
		t.Fatal("Add reported nothing new")
	}
	if a.Add("chat") {
		t.Fatal("Add of a known name reported it new")
	}
	if a.Len() != 2 || a.Lookup([]byte("sql")) != 1 || a.Lookup([]byte("chat")) != 2 || a.Lookup([]byte("")) != 0 {
		t.Fatalf("table: len %d, sql %d, chat %d", a.Len(), a.Lookup([]byte("sql")), a.Lookup([]byte("chat")))
	}
	for i := range MaxAdapters + 10 {
		a.Add(string(rune('a'+i%26)) + string(rune(i)))
	}
	if a.Len() != MaxAdapters {
		t.Fatalf("table grew to %d, beyond MaxAdapters", a.Len())
	}
	if allocs := testing.AllocsPerRun(100, func() { a.Lookup([]byte("sql")) }); allocs != 0 {
		t.Fatalf("Lookup allocates %v times", allocs)
	}
}

// A request for an adapter goes where the adapter is active, within the load bound; one for an
// adapter active nowhere avoids replicas whose slots other adapters' requests all hold; and
// the engine's own report counts as much as this proxy's requests.
func TestLeastTTFTRoutesByAdapter(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	tests := map[string]struct {
		// inflight[i] are the adapters (numbers) of replica i's requests from this proxy.
		inflight [][]int32
		// engine[i], when set, is replica i's report.
		engine []*LoRAInfo
		// base[i] are replica i's requests for the base model.
		base    []int64
		adapter int32
		want    int
	}{
		"where it is active": {
			inflight: [][]int32{{1}, {0}, {2}, {}}, adapter: 0, want: 1,
		},
		"not onto a replica whose slots are held": {
			// max_loras 2: replicas 0-2 hold two other adapters each; 3 holds one, with room,
			// though it is the busiest.
			inflight: [][]int32{{1, 2}, {3, 4}, {5, 6}, {7}}, base: []int64{0, 0, 0, 2}, adapter: 9, want: 3,
		},
		"the engine's report of what runs": {
			inflight: [][]int32{{}, {}, {}, {}},
			engine:   []*LoRAInfo{nil, nil, {Running: []int32{4}, MaxLoRAs: 2}, nil},
			adapter:  4, want: 2,
		},
		"the engine's max_lora over the configured one": {
			// Every replica holds two; replica 1's engine runs eight.
			inflight: [][]int32{{1, 2}, {3, 4}, {5, 6}, {7, 8}},
			engine:   []*LoRAInfo{nil, {Running: []int32{3, 4}, MaxLoRAs: 8}, nil, nil},
			adapter:  9, want: 1,
		},
		"not past the load bound": {
			// Replica 0 has the adapter but far more requests than the others.
			inflight: [][]int32{{0, 0, 0, 0, 0, 0, 0, 0}, {}, {}, {}},
			adapter:  0, want: -1, // any of 1-3
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := newTTFTPicker(t, Options{MaxLoRAs: 2, Now: clock})
			replicas := make([]*Replica, len(tc.inflight))
			for i, as := range tc.inflight {
				replicas[i] = &Replica{ID: i}
				if tc.base != nil {
					replicas[i].InFlight.Add(tc.base[i])
				}
				for _, a := range as {
					replicas[i].InFlight.Add(1)
					replicas[i].AdapterBegin(a)
				}
				if tc.engine != nil && tc.engine[i] != nil {
					info := *tc.engine[i]
					info.UpdatedAt = now.UnixNano()
					replicas[i].SetLoRA(info)
				}
			}
			for range 20 {
				req := &Request{Adapter: tc.adapter + 1}
				got := p.Pick(req, replicas)
				if tc.want >= 0 && got.ID != tc.want || tc.want < 0 && got.ID == 0 {
					t.Fatalf("picked replica %d, want %d", got.ID, tc.want)
				}
			}
		})
	}
}

// The recency list stands for an engine's LRU of adapters: an adapter used among the last
// max_loras on a replica is taken as still active there, an older one not; ending requests
// keeps the order.
func TestReplicaRemembersRecentAdapters(t *testing.T) {
	r := &Replica{}
	for _, a := range []int32{5, 6, 7, 5} {
		r.AdapterBegin(a)
		r.AdapterEnd(a)
	}
	for a, want := range map[int32]bool{5: true, 7: true, 6: false, 8: false} {
		if got := r.adapterView(a, 0, 0, 2).resident; got != want {
			t.Errorf("adapter %d resident = %v, want %v", a, got, want)
		}
	}
	if v := r.adapterView(5, 0, 0, 2); v.active != 0 {
		t.Fatalf("active = %d after every request ended", v.active)
	}
	// A load that failed (or a 404 for the adapter) means the replica does not have it.
	r.AdapterForget(5)
	if r.adapterView(5, 0, 0, 2).resident || !r.adapterView(7, 0, 0, 2).resident || !r.adapterView(6, 0, 0, 2).resident {
		t.Fatal("after forgetting 5: want 5 gone and 7 and 6 the two most recent")
	}
}

// A request that loaded its adapter teaches the load's cost, not the prefill line.
func TestLeastTTFTLearnsTheAdapterLoad(t *testing.T) {
	p := newTTFTPicker(t, Options{})
	r := &Replica{}
	for range 40 {
		p.Learn(r, Estimate{Tokens: 100, AdapterLoad: true}, Outcome{TTFT: 300 * time.Millisecond, Total: time.Second, PromptTokens: -1, CachedTokens: -1})
	}
	cost, loads := p.adapterCost(1, r, 0, 1)
	if !loads || cost < 0.25 || cost > 0.3 {
		t.Fatalf("adapter cost %.3f s (loads %v), want about 0.3 s less the line's base", cost, loads)
	}
	if p.pooledSamples.Load() != 0 {
		t.Fatal("a load's TTFT entered the prefill line")
	}
}
