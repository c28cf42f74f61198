package policy

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// replicaState is one replica of an llm_aware test: its in-flight count and, if scraped, what
// it reported and how long ago.
type replicaState struct {
	inFlight         int64
	scraped          bool
	age              time.Duration
	waiting, running int64
	kv               float64
}

func fresh(inFlight, waiting, running int64, kv float64) replicaState {
	return replicaState{inFlight: inFlight, scraped: true, waiting: waiting, running: running, kv: kv}
}

func TestLLMAware(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	prompt := chatPrompt(3, 1)
	tests := map[string]struct {
		states  []replicaState
		history []served
		prompt  string
		wantIDs []int
	}{
		"never scraped: least in-flight": {
			states:  []replicaState{{inFlight: 2}, {inFlight: 0}, {inFlight: 1}},
			wantIDs: []int{2},
		},
		"never scraped, ties at random": {
			states:  []replicaState{{inFlight: 1}, {inFlight: 0}, {inFlight: 0}},
			wantIDs: []int{2, 3},
		},
		"queue decides": {
			states:  []replicaState{fresh(5, 5, 0, 0), fresh(0, 0, 0, 0), fresh(3, 3, 0, 0)},
			wantIDs: []int{2},
		},
		"KV use decides between equal queues": {
			states:  []replicaState{fresh(4, 0, 4, 0.9), fresh(4, 0, 4, 0.2), fresh(4, 0, 4, 0.5)},
			wantIDs: []int{2},
		},
		// Replica 1 reported an empty queue, but 4 requests were sent since: they count.
		"in-flight the scrape has not seen counts as queued": {
			states:  []replicaState{fresh(8, 0, 4, 0.1), fresh(5, 1, 4, 0.1)},
			wantIDs: []int{2},
		},
		// Replica 1's long queue is 2 s old; judged on in-flight alone it is idle.
		"stale metrics are ignored": {
			states: []replicaState{
				{inFlight: 0, scraped: true, age: 2 * time.Second, waiting: 10, kv: 0.9},
				fresh(1, 0, 1, 0.5),
			},
			wantIDs: []int{1},
		},
		"metrics just within the limit count": {
			states: []replicaState{
				{inFlight: 0, scraped: true, age: time.Second, waiting: 10, kv: 0.9},
				fresh(1, 0, 1, 0.5),
			},
			wantIDs: []int{2},
		},
		// Replica 1 counts as idle with a full cache (−2), replica 2 as the busiest with the
		// longest queue (−4).
		"out-of-range metrics are clamped": {
			states:  []replicaState{fresh(0, -3, 0, 7), fresh(2, 2, 0, 0)},
			wantIDs: []int{1},
		},
		"NaN KV use counts as none": {
			states:  []replicaState{fresh(0, 0, 0, 0.5), fresh(0, 0, 0, math.NaN()), fresh(0, 0, 0, 0.5)},
			wantIDs: []int{2},
		},
		// 3 × 1 (whole prompt) − 2 × 1 (busiest) = 1 beats 0.
		"prefix outweighs the load": {
			states:  []replicaState{fresh(1, 0, 1, 0), fresh(0, 0, 0, 0), fresh(0, 0, 0, 0)},
			history: []served{{"", prompt, 1}},
			wantIDs: []int{1},
		},
		// 3 × 1 − 2 × 1 (busiest) − 2 × 1 (longest queue) = −1 loses to 0: a request that would
		// wait for a batch slot goes where it need not.
		"a queue outweighs the prefix": {
			states:  []replicaState{fresh(1, 3, 0, 0), fresh(0, 0, 0, 0), fresh(0, 0, 0, 0)},
			history: []served{{"", prompt, 1}},
			wantIDs: []int{2, 3},
		},
		// Equal queues (none): the less busy replica wins, as under least_load.
		"busy decides between empty queues": {
			states:  []replicaState{fresh(12, 0, 12, 0.3), fresh(3, 0, 3, 0.3), fresh(7, 0, 7, 0.3)},
			wantIDs: []int{2},
		},
		// 3 × 0.5 − 2 × 1 (full KV cache) = −0.5 loses to 0.
		"full KV cache outweighs half a prefix": {
			states:  []replicaState{fresh(0, 0, 0, 1), fresh(0, 0, 0, 0)},
			history: []served{{"", prompt[:len(prompt)/2], 1}},
			wantIDs: []int{2},
		},
		// total 6: the bound is 4.33 requests, so replica 1 loses its affinity.
		"prefix lost over the load bound": {
			states:  []replicaState{{inFlight: 6}, {inFlight: 0}, {inFlight: 0}},
			history: []served{{"", prompt, 1}},
			wantIDs: []int{2, 3},
		},
		"equal scores go to fewer in flight": {
			states:  []replicaState{fresh(2, 0, 2, 0.3), fresh(1, 0, 2, 0.3)},
			wantIDs: []int{2},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if tc.prompt == "" {
				tc.prompt = prompt
			}
			seen := map[int]bool{}
			for draw := range 50 {
				p, err := New(LLMAware, Options{Rand: seeded(uint64(draw)), Now: func() time.Time { return now }})
				if err != nil {
					t.Fatal(err)
				}
				remember(p.(*llmAware).index, tc.history)
				rs := make([]*Replica, len(tc.states))
				for i, s := range tc.states {
					rs[i] = &Replica{ID: i + 1}
					rs[i].InFlight.Store(s.inFlight)
					if s.scraped {
						rs[i].SetMetrics(Metrics{Waiting: s.waiting, Running: s.running, KVCacheUsage: s.kv, UpdatedAt: now.Add(-s.age).UnixNano()})
					}
				}
				seen[p.Pick(&Request{Prompt: []byte(tc.prompt)}, rs).ID] = true
			}
			var got []int
			for id := range len(tc.states) + 1 {
				if seen[id] {
					got = append(got, id)
				}
			}
			if diff := cmp.Diff(tc.wantIDs, got); diff != "" {
				t.Errorf("picked ids (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLLMAwareMetricsGoStale: the same replicas and metrics, judged at two times.
func TestLLMAwareMetricsGoStale(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	now := start
	p, _ := New(LLMAware, Options{Now: func() time.Time { return now }, MetricsStaleAfter: 500 * time.Millisecond})
	rs := replicas([]int64{0, 1})
	rs[0].SetMetrics(Metrics{Waiting: 9, UpdatedAt: start.UnixNano()})
	req := &Request{Prompt: []byte(strings.Repeat("x", 10))}
	if got := p.Pick(req, rs).ID; got != 2 {
		t.Errorf("fresh queue of 9: picked %d, want 2", got)
	}
	now = start.Add(501 * time.Millisecond)
	if got := p.Pick(req, rs).ID; got != 1 {
		t.Errorf("stale queue: picked %d, want 1 (fewest in flight)", got)
	}
}

func TestMetricsRoundTrip(t *testing.T) {
	var r Replica
	if got := r.LoadMetrics(); got != (Metrics{}) {
		t.Errorf("never scraped: %+v, want zero", got)
	}
	want := Metrics{Waiting: 3, Running: 12, KVCacheUsage: 0.625, CacheTokens: 65536, PrefixQueries: 1000, PrefixHits: 250, UpdatedAt: 42}
	r.SetMetrics(want)
	if diff := cmp.Diff(want, r.LoadMetrics()); diff != "" {
		t.Errorf("LoadMetrics (-want +got):\n%s", diff)
	}
}
