package policy

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestHashBlocks(t *testing.T) {
	block := func(c byte) string { return strings.Repeat(string(c), prefixBlockBytes) }
	hashes := func(model, prompt string) []uint64 {
		var dst [maxPrefixBlocks]uint64
		n := hashBlocks(&dst, []byte(model), []byte(prompt))
		return dst[:n]
	}
	tests := map[string]struct {
		model, prompt string
		wantBlocks    int
		// sameAs lists, per block, whether it equals the same block of the reference prompt.
		refModel, ref string
		wantSame      []bool
	}{
		"empty":                 {prompt: "", wantBlocks: 0},
		"shorter than a block":  {prompt: block('a')[1:], wantBlocks: 0},
		"partial block ignored": {prompt: block('a') + block('b') + "tail", wantBlocks: 2},
		"bounded":               {prompt: strings.Repeat("x", 300*prefixBlockBytes), wantBlocks: maxPrefixBlocks},
		"shared prefix": {
			model: "m", prompt: block('a') + block('b') + block('c'),
			refModel: "m", ref: block('a') + block('b') + block('d'),
			wantBlocks: 3, wantSame: []bool{true, true, false},
		},
		// Block 1 is the same text, but it follows a different block 0: chained hashes differ.
		"chained": {
			model: "m", prompt: block('a') + block('b'),
			refModel: "m", ref: block('z') + block('b'),
			wantBlocks: 2, wantSame: []bool{false, false},
		},
		"model seeds the chain": {
			model: "llama", prompt: block('a'),
			refModel: "mistral", ref: block('a'),
			wantBlocks: 1, wantSame: []bool{false},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := hashes(tc.model, tc.prompt)
			if len(got) != tc.wantBlocks {
				t.Fatalf("%d blocks, want %d", len(got), tc.wantBlocks)
			}
			if tc.wantSame == nil {
				return
			}
			ref := hashes(tc.refModel, tc.ref)
			same := make([]bool, len(got))
			for i := range got {
				same[i] = got[i] == ref[i]
			}
			if diff := cmp.Diff(tc.wantSame, same); diff != "" {
				t.Errorf("blocks equal to the reference's (-want +got):\n%s", diff)
			}
		})
	}
}

// served is a prompt the index remembers as sent to a replica.
type served struct {
	model, prompt string
	id            int
}

func TestPrefixAffinity(t *testing.T) {
	system := chatPrompt(1, 0)[:1600] // 25 blocks of a shared system prompt
	convA, convB, convC := system+strings.Repeat("a", 400), system+strings.Repeat("b", 400), system+strings.Repeat("c", 400)
	tests := map[string]struct {
		history []served
		loads   []int64
		model   string
		prompt  string
		wantIDs []int // every replica picked over many draws of the same decision
	}{
		"no history goes to least load": {loads: []int64{2, 0, 0}, prompt: convA, wantIDs: []int{2, 3}},
		"prompt shorter than a block":   {history: []served{{"", "hi", 1}}, loads: []int64{1, 0}, prompt: "hi", wantIDs: []int{2}},
		"same prompt returns":           {history: []served{{"", convA, 1}}, loads: []int64{1, 0, 0}, prompt: convA, wantIDs: []int{1}},
		"continued conversation":        {history: []served{{"", convA, 3}}, loads: []int64{0, 0, 1}, prompt: convA + strings.Repeat("more", 100), wantIDs: []int{3}},
		"longer match wins": {
			history: []served{{"", convA, 1}, {"", convB, 2}},
			loads:   []int64{1, 0, 0}, prompt: convA, wantIDs: []int{1},
		},
		// Both holders of the system prompt match equally; the less loaded one wins over an
		// idle replica without it.
		"least loaded holder": {
			history: []served{{"", convA, 1}, {"", convB, 2}},
			loads:   []int64{3, 1, 0}, prompt: convC, wantIDs: []int{2},
		},
		// total 6: mean after placing (6+1)/3, bound max(1.5 × 7/3, 7/3 + 2) = 4.33 < 7.
		"over the bound goes by load": {
			history: []served{{"", convA, 1}},
			loads:   []int64{6, 0, 0}, prompt: convA, wantIDs: []int{2, 3},
		},
		// total 2: mean 1, bound max(1.5, 3) = 3 = the holder's load with this request.
		"at the bound keeps affinity": {
			history: []served{{"", convA, 1}},
			loads:   []int64{2, 0, 0}, prompt: convA, wantIDs: []int{1},
		},
		"just over the bound": {
			history: []served{{"", convA, 1}},
			loads:   []int64{3, 0, 0}, prompt: convA, wantIDs: []int{2, 3},
		},
		"over the bound, next holder": {
			history: []served{{"", convB, 2}, {"", convA, 1}},
			loads:   []int64{6, 1, 0}, prompt: convA, wantIDs: []int{2},
		},
		"other model does not match": {
			history: []served{{"llama", convA, 1}},
			loads:   []int64{1, 0}, model: "mistral", prompt: convA, wantIDs: []int{2},
		},
		"replica gone": {history: []served{{"", convA, 7}}, loads: []int64{1, 0, 1}, prompt: convA, wantIDs: []int{2}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			seen := map[int]bool{}
			for draw := range 50 {
				// A fresh picker per draw: each pick records, which would change the next one.
				p, err := New(PrefixAffinity, Options{Rand: seeded(uint64(draw))})
				if err != nil {
					t.Fatal(err)
				}
				remember(p.(*prefixAffinity).index, tc.history)
				seen[p.Pick(&Request{Model: []byte(tc.model), Prompt: []byte(tc.prompt)}, replicas(tc.loads)).ID] = true
			}
			var got []int
			for id := range len(tc.loads) + 1 {
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

// remember records history in the index as picks to those replicas would have.
func remember(ix *prefixIndex, history []served) {
	for _, h := range history {
		var m prefixMatch
		ix.lookup(&m, []byte(h.model), []byte(h.prompt))
		ix.record(&m, &Replica{ID: h.id})
	}
}

// simulation replays requests against a picker with concurrency simulated by in-flight counts:
// each request is picked and held, and once concurrency requests are held a random one
// finishes before the next is picked.
type simulation struct {
	rs      []*Replica
	held    []*Replica
	gen     *rand.Rand
	counts  map[int]int
	maxSeen float64 // largest in-flight / mean in-flight seen after warm-up
}

func newSimulation(n int, seed uint64) *simulation {
	return &simulation{rs: replicas(make([]int64, n)), gen: rand.New(rand.NewPCG(seed, seed)), counts: map[int]int{}}
}

func (s *simulation) request(p Picker, req *Request, concurrency int) *Replica {
	if len(s.held) == concurrency {
		i := s.gen.IntN(len(s.held))
		s.held[i].InFlight.Add(-1)
		s.held[i] = s.held[len(s.held)-1]
		s.held = s.held[:len(s.held)-1]
	}
	r := p.Pick(req, s.rs)
	r.InFlight.Add(1)
	s.held = append(s.held, r)
	s.counts[r.ID]++
	if len(s.held) == concurrency {
		mean := float64(concurrency) / float64(len(s.rs))
		for _, r := range s.rs {
			s.maxSeen = max(s.maxSeen, float64(r.InFlight.Load())/mean)
		}
	}
	return r
}

// TestSharedSystemPromptDoesNotPileUp is the failure vLLM production-stack users report: every
// request shares one 2 KB system prompt, and prefix routing sends them all to the replica that
// cached it. With the load bound no replica holds more than 1.5× the mean, at any moment or in
// total; without it (a huge factor) the same run piles everything onto one replica.
func TestSharedSystemPromptDoesNotPileUp(t *testing.T) {
	tests := map[string]struct {
		policy     string
		factor     float64
		wantPileUp bool
	}{
		"prefix affinity":           {policy: PrefixAffinity},
		"llm aware":                 {policy: LLMAware},
		"prefix affinity unbounded": {policy: PrefixAffinity, factor: 1000, wantPileUp: true},
		"llm aware unbounded":       {policy: LLMAware, factor: 1000, wantPileUp: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			const n, concurrency, requests = 8, 64, 1000
			p, err := New(tc.policy, Options{Rand: seeded(4), PrefixLoadFactor: tc.factor})
			if err != nil {
				t.Fatal(err)
			}
			sim := newSimulation(n, 4)
			system := chatPrompt(2, 0)[:2048]
			for i := range requests {
				prompt := fmt.Sprintf(`%s"},{"role":"user","content":"request %d asks something else entirely"}]`, system, i)
				sim.request(p, &Request{Model: []byte("m"), Prompt: []byte(prompt)}, concurrency)
			}
			busiest := 0
			for _, c := range sim.counts {
				busiest = max(busiest, c)
			}
			pileUp := sim.maxSeen > 1.5 || float64(busiest) > 1.5*requests/n
			if pileUp != tc.wantPileUp {
				t.Errorf("pile-up = %v, want %v: busiest replica held %.2f× the mean in-flight and served %d of %d requests (counts %v)",
					pileUp, tc.wantPileUp, sim.maxSeen, busiest, requests, sim.counts)
			}
		})
	}
}

// TestConversationsStayPut: every turn of a conversation goes where its earlier turns went while
// the load allows, and conversations spread over the replicas.
func TestConversationsStayPut(t *testing.T) {
	for _, name := range []string{PrefixAffinity, LLMAware} {
		t.Run(name, func(t *testing.T) {
			const n, conversations, turns = 4, 40, 6
			p, err := New(name, Options{Rand: seeded(8)})
			if err != nil {
				t.Fatal(err)
			}
			sim := newSimulation(n, 8)
			prompts := make([]string, conversations)
			home := make([]int, conversations)
			for i := range prompts {
				prompts[i] = fmt.Sprintf(`[{"role":"system","content":"You help with conversation %d."}`, i)
			}
			moved := 0
			for turn := range turns {
				for i := range prompts {
					prompts[i] += fmt.Sprintf(`,{"role":"user","content":"turn %d of conversation %d, with enough words to fill a block"}`, turn, i)
					r := sim.request(p, &Request{Prompt: []byte(prompts[i] + "]")}, 8)
					if turn > 0 && r.ID != home[i] {
						moved++
					}
					home[i] = r.ID
				}
			}
			// Eight concurrent requests over four replicas leave room within the bound for
			// nearly every turn to return home; a few move when their home is the busiest.
			if moved > conversations*(turns-1)/10 {
				t.Errorf("%d of %d later turns left their conversation's replica", moved, conversations*(turns-1))
			}
			for id := 1; id <= n; id++ {
				if c := sim.counts[id]; c < conversations*turns/n/2 {
					t.Errorf("replica %d served %d requests; conversations did not spread (counts %v)", id, c, sim.counts)
				}
			}
		})
	}
}

// TestPrefixIndexForgetsLeastRecentFirst: the index is bounded, and under pressure a prompt
// loses its last blocks before its first, so what remains still matches.
func TestPrefixIndexForgetsLeastRecentFirst(t *testing.T) {
	ix, err := newPrefixIndex(64)
	if err != nil {
		t.Fatal(err)
	}
	a := strings.Repeat("a", 10*prefixBlockBytes)
	b := strings.Repeat("b", 60*prefixBlockBytes)
	remember(ix, []served{{"", a, 1}, {"", b, 2}})

	var m prefixMatch
	ix.lookup(&m, nil, []byte(a))
	// 70 blocks in a 64-block index: the 6 least recent, a's last 6, are gone.
	if m.blocks != 10 || m.matched != 4 || m.depthOf(&Replica{ID: 1}) != 4 {
		t.Errorf("after eviction: %d blocks, %d matched, depth %d; want 10, 4, 4", m.blocks, m.matched, m.depthOf(&Replica{ID: 1}))
	}
	if got := ix.blocks.Len(); got != 64 {
		t.Errorf("index holds %d blocks, want its capacity 64", got)
	}
}

// TestHolderSlots: replicas whose IDs are 64 apart share a slot (a documented approximation);
// others never do.
func TestHolderSlots(t *testing.T) {
	ix, _ := newPrefixIndex(1024)
	prompt := strings.Repeat("p", 3*prefixBlockBytes)
	remember(ix, []served{{"", prompt[:prefixBlockBytes], 5}, {"", prompt, 7}})
	var m prefixMatch
	ix.lookup(&m, nil, []byte(prompt))
	got := map[int]int{}
	for _, id := range []int{5, 7, 8, 69, 71} {
		got[id] = m.depthOf(&Replica{ID: id})
	}
	want := map[int]int{5: 1, 7: 3, 8: 0, 69: 1, 71: 3}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("depth by replica id (-want +got):\n%s", diff)
	}
}

// TestPromptPickersAreSafeConcurrently runs many pickers' decisions at once (for -race).
func TestPromptPickersAreSafeConcurrently(t *testing.T) {
	for _, name := range []string{PrefixAffinity, LLMAware} {
		p, _ := New(name, Options{PrefixCacheBlocks: 2048})
		rs := replicas(make([]int64, 6))
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() {
				for i := range 300 {
					req := &Request{Model: []byte("m"), Prompt: []byte(chatPrompt(i%3, (i*7+w)%50))}
					r := p.Pick(req, rs)
					r.InFlight.Add(1)
					if i%2 == 0 {
						r.SetMetrics(Metrics{Waiting: int64(i % 4), Running: 3, KVCacheUsage: 0.5})
					}
					r.InFlight.Add(-1)
				}
			})
		}
		wg.Wait()
	}
}

// TestPickDoesNotAllocate: once the index knows a prompt, picking it allocates nothing, whatever
// the policy.
func TestPickDoesNotAllocate(t *testing.T) {
	targets := map[string]float64{"A100": 1}
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			p, err := New(name, Options{TargetQPSPerAccelerator: targets})
			if err != nil {
				t.Fatal(err)
			}
			rs := replicas([]int64{1, 0, 2, 1}, "A100", "A100", "A100", "A100")
			req := &Request{SessionID: []byte("s-1"), Model: []byte("m"), Prompt: []byte(chatPrompt(0, 1))}
			p.Pick(req, rs)
			if allocs := testing.AllocsPerRun(100, func() { p.Pick(req, rs) }); allocs != 0 {
				t.Errorf("%v allocations per pick, want 0", allocs)
			}
		})
	}
}
