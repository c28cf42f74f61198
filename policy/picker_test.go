package policy

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// replicas builds a snapshot with the given in-flight counts and accelerators (accelerators may
// be shorter than loads).
func replicas(loads []int64, accelerators ...string) []*Replica {
	out := make([]*Replica, len(loads))
	for i, load := range loads {
		r := &Replica{ID: i + 1, Addr: fmt.Sprintf("10.0.0.1:%d", 8000+i)}
		if i < len(accelerators) {
			r.Accelerator = accelerators[i]
		}
		r.InFlight.Store(load)
		out[i] = r
	}
	return out
}

func seeded(seed uint64) func() uint64 {
	src := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var mu sync.Mutex
	return func() uint64 {
		mu.Lock()
		defer mu.Unlock()
		return src.Uint64()
	}
}

func ids(rs ...*Replica) []int {
	out := make([]int, 0, len(rs))
	for _, r := range rs {
		if r == nil {
			out = append(out, 0)
			continue
		}
		out = append(out, r.ID)
	}
	return out
}

func TestNew(t *testing.T) {
	tests := map[string]struct {
		name      string
		opts      Options
		wantNeeds Needs
		wantErr   string
	}{
		"round robin":           {name: RoundRobin},
		"least load":            {name: LeastLoad},
		"empty is the default":  {name: "", wantNeeds: NeedsPrompt | PromptOptional | NeedsMetrics | WeighsQueues},
		"least ttft":            {name: LeastTTFT, wantNeeds: NeedsPrompt | PromptOptional | NeedsMetrics | WeighsQueues},
		"ttft load factor":      {name: LeastTTFT, opts: Options{TTFTLoadFactor: 0.9}, wantErr: "TTFT load factor 0.9: must be a number of at least 1"},
		"negative cache tokens": {name: LeastTTFT, opts: Options{PrefixCacheTokens: -5}, wantErr: "prefix cache tokens -5: must be positive"},
		"instance aware":        {name: InstanceAwareLeastLoad, opts: Options{TargetQPSPerAccelerator: map[string]float64{"A100": 2}}},
		"power of two":          {name: PowerOfTwo},
		"session affinity":      {name: SessionAffinity, wantNeeds: NeedsSession},
		"prefix affinity":       {name: PrefixAffinity, wantNeeds: NeedsPrompt},
		"llm aware":             {name: LLMAware, wantNeeds: NeedsPrompt | NeedsMetrics},
		"tiny prefix cache":     {name: PrefixAffinity, opts: Options{PrefixCacheBlocks: 1}, wantNeeds: NeedsPrompt},
		"tuned": {
			name:      LLMAware,
			opts:      Options{SessionLoadFactor: 1, PrefixLoadFactor: 3, PrefixCacheBlocks: 100, MetricsStaleAfter: time.Minute},
			wantNeeds: NeedsPrompt | NeedsMetrics,
		},
		"unknown":                    {name: "fastest", wantErr: `unknown load balancing policy "fastest"`},
		"instance aware without map": {name: InstanceAwareLeastLoad, wantErr: "needs target QPS"},
		"instance aware zero target": {
			name:    InstanceAwareLeastLoad,
			opts:    Options{TargetQPSPerAccelerator: map[string]float64{"A100": 0, "L4": -1}},
			wantErr: `accelerator "A100" is 0`,
		},
		"session factor below one": {name: SessionAffinity, opts: Options{SessionLoadFactor: 0.5}, wantErr: "session load factor 0.5: must be a number of at least 1"},
		"prefix factor NaN":        {name: PrefixAffinity, opts: Options{PrefixLoadFactor: math.NaN()}, wantErr: "prefix load factor NaN"},
		"prefix factor infinite":   {name: PrefixAffinity, opts: Options{PrefixLoadFactor: math.Inf(1)}, wantErr: "prefix load factor +Inf"},
		"negative cache":           {name: PrefixAffinity, opts: Options{PrefixCacheBlocks: -1}, wantErr: "prefix cache blocks -1: must be positive"},
		"negative staleness":       {name: LLMAware, opts: Options{MetricsStaleAfter: -time.Second}, wantErr: "metrics stale after -1s"},
		"every error at once": {
			name:    "",
			opts:    Options{SessionLoadFactor: -1, PrefixLoadFactor: -1},
			wantErr: "load balancing policy least_ttft: session load factor -1: must be a number of at least 1\nprefix load factor -1",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p, err := New(tc.name, tc.opts)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("New(%q) error = %v, want it to contain %q", tc.name, err, tc.wantErr)
				}
				return
			}
			if err != nil || p == nil {
				t.Fatalf("New(%q) = %v, %v; want a picker", tc.name, p, err)
			}
			if got := NeedsOf(p); got != tc.wantNeeds {
				t.Errorf("NeedsOf(%q) = %b, want %b", tc.name, got, tc.wantNeeds)
			}
			if got := p.Pick(&Request{}, nil); got != nil {
				t.Errorf("Pick(nil) = %v, want nil", got)
			}
			rs := replicas([]int64{2, 0, 1})
			if got := p.Pick(&Request{SessionID: []byte("s"), Prompt: []byte(chatPrompt(0, 0))}, rs); got == nil {
				t.Errorf("Pick over three replicas = nil")
			}
		})
	}
}

// TestNamesAreAccepted: every advertised name builds a picker, so help text never lies.
func TestNamesAreAccepted(t *testing.T) {
	opts := Options{TargetQPSPerAccelerator: map[string]float64{"A100": 1}}
	for _, name := range Names() {
		if _, err := New(name, opts); err != nil {
			t.Errorf("New(%q): %v", name, err)
		}
	}
	if !slices.IsSorted(Names()) {
		t.Errorf("Names() = %v, want sorted", Names())
	}
}

func TestRoundRobin(t *testing.T) {
	p, _ := New(RoundRobin, Options{})
	rs := replicas([]int64{5, 0, 9})
	var got []int
	for range 7 {
		got = append(got, p.Pick(&Request{}, rs).ID)
	}
	if diff := cmp.Diff([]int{1, 2, 3, 1, 2, 3, 1}, got); diff != "" {
		t.Errorf("round robin order (-want +got):\n%s", diff)
	}
}

func TestRoundRobinConcurrentIsEven(t *testing.T) {
	p, _ := New(RoundRobin, Options{})
	rs := replicas([]int64{0, 0, 0})
	const workers, each = 8, 300
	counts := make([]int, len(rs))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			local := make([]int, len(rs))
			for range each {
				local[p.Pick(&Request{}, rs).ID-1]++
			}
			mu.Lock()
			for i, n := range local {
				counts[i] += n
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	want := []int{workers * each / 3, workers * each / 3, workers * each / 3}
	if diff := cmp.Diff(want, counts); diff != "" {
		t.Errorf("round robin counts (-want +got):\n%s", diff)
	}
}

func TestLeastLoad(t *testing.T) {
	tests := map[string]struct {
		loads   []int64
		wantIDs []int // the acceptable picks
	}{
		"single":          {loads: []int64{3}, wantIDs: []int{1}},
		"unique minimum":  {loads: []int64{4, 1, 7}, wantIDs: []int{2}},
		"minimum is last": {loads: []int64{4, 2, 0}, wantIDs: []int{3}},
		"ties":            {loads: []int64{2, 0, 5, 0}, wantIDs: []int{2, 4}},
		"all equal":       {loads: []int64{1, 1, 1}, wantIDs: []int{1, 2, 3}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p, _ := New(LeastLoad, Options{Rand: seeded(1)})
			rs := replicas(tc.loads)
			seen := map[int]bool{}
			for range 200 {
				got := p.Pick(&Request{}, rs)
				seen[got.ID] = true
			}
			var gotIDs []int
			for id := range len(rs) + 1 {
				if seen[id] {
					gotIDs = append(gotIDs, id)
				}
			}
			// Over 200 seeded draws every tied replica is chosen at least once, and nothing else is.
			if diff := cmp.Diff(tc.wantIDs, gotIDs); diff != "" {
				t.Errorf("picked ids (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLeastLoadAlwaysMinimal checks the property on many random snapshots: the pick's load is
// the snapshot's minimum.
func TestLeastLoadAlwaysMinimal(t *testing.T) {
	gen := rand.New(rand.NewPCG(7, 11))
	p, _ := New(LeastLoad, Options{Rand: seeded(3)})
	for trial := range 2000 {
		loads := make([]int64, 1+gen.IntN(12))
		for i := range loads {
			loads[i] = int64(gen.IntN(4))
		}
		rs := replicas(loads)
		got := p.Pick(&Request{}, rs)
		minimum := loads[0]
		for _, l := range loads {
			minimum = min(minimum, l)
		}
		if got == nil || got.InFlight.Load() != minimum {
			t.Fatalf("trial %d: loads %v: picked %v, want a replica with load %d", trial, loads, ids(got), minimum)
		}
	}
}

// TestLeastLoadTieBreakIsReplayable: the same seed gives the same sequence of decisions.
func TestLeastLoadTieBreakIsReplayable(t *testing.T) {
	run := func() []int {
		p, _ := New(LeastLoad, Options{Rand: seeded(42)})
		rs := replicas([]int64{0, 0, 0, 0})
		var got []int
		for range 20 {
			got = append(got, p.Pick(&Request{}, rs).ID)
		}
		return got
	}
	if diff := cmp.Diff(run(), run()); diff != "" {
		t.Errorf("same seed, different decisions (-first +second):\n%s", diff)
	}
}

func TestInstanceAwareLeastLoad(t *testing.T) {
	targets := map[string]float64{"H100": 4, "A100": 2, "L4": 1}
	tests := map[string]struct {
		loads        []int64
		accelerators []string
		prepare      bool
		wantIDs      []int
	}{
		// 6/4 = 1.5 < 2/1 = 2: the faster GPU wins although it holds more requests.
		"capacity beats raw count": {loads: []int64{6, 2}, accelerators: []string{"H100", "L4"}, wantIDs: []int{1}},
		"raw count when equal":     {loads: []int64{3, 1}, accelerators: []string{"A100", "A100"}, wantIDs: []int{2}},
		// Unknown accelerator is treated as the minimum target (L4, 1): 1/1 = 1 > 2/4 = 0.5.
		"unknown is weakest": {loads: []int64{1, 2}, accelerators: []string{"TPU", "H100"}, wantIDs: []int{2}},
		"empty accelerator":  {loads: []int64{0, 1}, accelerators: []string{"", "H100"}, wantIDs: []int{1}},
		"prepared":           {loads: []int64{6, 2}, accelerators: []string{"H100", "L4"}, prepare: true, wantIDs: []int{1}},
		// 4/4 = 2/2 = 1: tie, both chosen over many draws.
		"tie across types": {loads: []int64{4, 2, 5}, accelerators: []string{"H100", "A100", "L4"}, wantIDs: []int{1, 2}},
		// Placements and YAML keys may differ in case ("a100" from a cluster's node label).
		"case ignored": {loads: []int64{3, 2}, accelerators: []string{"h100", "L4"}, wantIDs: []int{1}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p, err := New(InstanceAwareLeastLoad, Options{TargetQPSPerAccelerator: targets, Rand: seeded(5)})
			if err != nil {
				t.Fatal(err)
			}
			rs := replicas(tc.loads, tc.accelerators...)
			if tc.prepare {
				p.(Preparer).Prepare(rs)
			}
			seen := map[int]bool{}
			for range 200 {
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

// TestInstanceAwareMapIsCopied: a caller mutating its map later does not race with Pick.
func TestInstanceAwareMapIsCopied(t *testing.T) {
	targets := map[string]float64{"A100": 2, "L4": 1}
	p, _ := New(InstanceAwareLeastLoad, Options{TargetQPSPerAccelerator: targets})
	targets["L4"] = 100
	rs := replicas([]int64{1, 1}, "A100", "L4")
	if got := p.Pick(&Request{}, rs).ID; got != 1 {
		t.Errorf("Pick = replica %d, want 1 (A100: 1/2 < L4: 1/1)", got)
	}
}

// BenchmarkPick measures one decision per policy. Prompt-reading policies get realistic chat
// prompts: a 1.5 KiB system prompt shared by all, then one of 256 conversations (about 2 KiB in
// all), so the prefix index is warm and every lookup walks a long match, as in production.
func BenchmarkPick(b *testing.B) {
	targets := map[string]float64{"H100": 4, "A100": 2, "L4": 1}
	now := time.Unix(1_700_000_000, 0)
	const conversations = 256
	prompts := make([][]byte, conversations)
	for i := range prompts {
		prompts[i] = []byte(chatPrompt(0, i))
	}
	for _, name := range Names() {
		for _, n := range []int{4, 32} {
			b.Run(fmt.Sprintf("%s/replicas=%d", name, n), func(b *testing.B) {
				p, err := New(name, Options{TargetQPSPerAccelerator: targets, Now: func() time.Time { return now }})
				if err != nil {
					b.Fatal(err)
				}
				loads := make([]int64, n)
				accelerators := make([]string, n)
				for i := range loads {
					loads[i] = int64(i % 3)
					accelerators[i] = []string{"H100", "A100", "L4"}[i%3]
				}
				rs := replicas(loads, accelerators...)
				for i, r := range rs {
					r.SetMetrics(Metrics{Waiting: int64(i % 2), Running: 4, KVCacheUsage: 0.4, UpdatedAt: now.UnixNano()})
				}
				if prep, ok := p.(Preparer); ok {
					prep.Prepare(rs)
				}
				for i := range prompts {
					p.Pick(&Request{Prompt: prompts[i], Model: []byte("llama")}, rs)
				}
				var next atomic.Uint64
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					var req Request
					req.Model = []byte("llama")
					for pb.Next() {
						i := next.Add(1)
						req.Prompt = prompts[i%conversations]
						req.SessionID = sessionIDs[i%uint64(len(sessionIDs))]
						if p.Pick(&req, rs) == nil {
							b.Fatal("nil pick")
						}
					}
				})
			})
		}
	}
}

var sessionIDs = func() [][]byte {
	out := make([][]byte, 64)
	for i := range out {
		out[i] = fmt.Appendf(nil, "session-%d", i)
	}
	return out
}()

// chatPrompt is the JSON "messages" value of a chat request, about 2 KiB: system prompt number
// system (about 1.5 KiB, shared by every conversation using it) and a user turn that differs per
// conversation.
func chatPrompt(system, conversation int) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, `[{"role":"system","content":"You are assistant %d. `, system)
	for i := 0; sb.Len() < 1536; i++ {
		fmt.Fprintf(&sb, "Rule %d: answer precisely, cite sources, and keep answers short. ", i)
	}
	fmt.Fprintf(&sb, `"},{"role":"user","content":"Question %d: `, conversation)
	for sb.Len() < 2048 {
		fmt.Fprintf(&sb, "what about case %d? ", conversation)
	}
	sb.WriteString(`"}]`)
	return sb.String()
}

// SkyServe also accepts "A100:1" as a key; it means the A100.
func TestInstanceAwareKeysWithCount(t *testing.T) {
	p, err := New(InstanceAwareLeastLoad, Options{TargetQPSPerAccelerator: map[string]float64{"H100:1": 4, "L4:1": 1}, Rand: seeded(5)})
	if err != nil {
		t.Fatal(err)
	}
	rs := replicas([]int64{3, 1}, "H100", "L4") // 3/4 < 1/1
	for range 20 {
		if got := p.Pick(&Request{}, rs).ID; got != 1 {
			t.Fatalf("picked %d, want the H100 (1)", got)
		}
	}
}
