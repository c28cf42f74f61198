package policy

import (
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestPowerOfTwo(t *testing.T) {
	tests := map[string]struct {
		loads   []int64
		wantIDs []int // every replica picked over many seeded draws, and only those
	}{
		"single": {loads: []int64{7}, wantIDs: []int{1}},
		// Two replicas are always both sampled: the lighter one always wins.
		"two":                     {loads: []int64{3, 1}, wantIDs: []int{2}},
		"unique maximum is never": {loads: []int64{9, 1, 1}, wantIDs: []int{2, 3}},
		// The second-heaviest wins only against the heaviest; the lightest wins whenever sampled.
		"ordered":   {loads: []int64{0, 1, 2}, wantIDs: []int{1, 2}},
		"all equal": {loads: []int64{1, 1, 1, 1}, wantIDs: []int{1, 2, 3, 4}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p, _ := New(PowerOfTwo, Options{Rand: seeded(9)})
			rs := replicas(tc.loads)
			seen := map[int]bool{}
			for range 300 {
				seen[p.Pick(&Request{}, rs).ID] = true
			}
			var gotIDs []int
			for id := range len(rs) + 1 {
				if seen[id] {
					gotIDs = append(gotIDs, id)
				}
			}
			if diff := cmp.Diff(tc.wantIDs, gotIDs); diff != "" {
				t.Errorf("picked ids (-want +got):\n%s", diff)
			}
		})
	}
}

// TestPowerOfTwoSamplesDistinctPairs: with every replica at a different load, how often each
// wins matches sampling two distinct replicas uniformly. With n replicas ordered by load, the
// k-th lightest (k from 0) wins exactly when it is sampled together with a heavier one:
// 2(n-1-k) / (n(n-1)) of the time. Sampling with replacement would give the heaviest a share.
func TestPowerOfTwoSamplesDistinctPairs(t *testing.T) {
	const n, draws = 5, 50_000
	p, _ := New(PowerOfTwo, Options{Rand: seeded(13)})
	rs := replicas([]int64{0, 1, 2, 3, 4})
	counts := make([]int, n)
	for range draws {
		counts[p.Pick(&Request{}, rs).ID-1]++
	}
	for k, got := range counts {
		want := float64(draws) * 2 * float64(n-1-k) / float64(n*(n-1))
		if diff := float64(got) - want; diff > 0.05*draws/n || diff < -0.05*draws/n {
			t.Errorf("replica with load %d won %d times, want about %.0f (counts %v)", k, got, want, counts)
		}
	}
}

// TestPowerOfTwoNeverPicksTheUniqueMaximum checks the property on random snapshots.
func TestPowerOfTwoNeverPicksTheUniqueMaximum(t *testing.T) {
	gen := rand.New(rand.NewPCG(3, 5))
	p, _ := New(PowerOfTwo, Options{Rand: seeded(17)})
	for trial := range 2000 {
		loads := make([]int64, 2+gen.IntN(10))
		for i := range loads {
			loads[i] = int64(gen.IntN(6))
		}
		rs := replicas(loads)
		got := p.Pick(&Request{}, rs).InFlight.Load()
		maximum := got
		for _, l := range loads {
			maximum = max(maximum, l)
		}
		if got == maximum && count(loads, maximum) == 1 {
			t.Fatalf("trial %d: loads %v: picked the unique maximum %d", trial, loads, got)
		}
	}
}

func count(loads []int64, v int64) int {
	n := 0
	for _, l := range loads {
		if l == v {
			n++
		}
	}
	return n
}
