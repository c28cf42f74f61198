package policy

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func newTTFTPicker(t testing.TB, opts Options) *leastTTFT {
	t.Helper()
	if opts.Rand == nil {
		opts.Rand = seeded(1)
	}
	p, err := New(LeastTTFT, opts)
	if err != nil {
		t.Fatal(err)
	}
	return p.(*leastTTFT)
}

// conversation returns the messages JSON of a chat with a shared system prompt of systemBytes
// and turns user/assistant exchanges of turnBytes each, as a client resends it every turn.
func conversation(id, systemBytes, turns, turnBytes int) []byte {
	var sb strings.Builder
	sb.WriteString(`[{"role":"system","content":"`)
	for sb.Len() < systemBytes {
		sb.WriteString("You are a helpful assistant; answer briefly. ")
	}
	sb.WriteString(`"}`)
	for turn := range turns {
		for _, role := range []string{"user", "assistant"} {
			fmt.Fprintf(&sb, `,{"role":"%s","content":"`, role)
			start := sb.Len()
			for sb.Len()-start < turnBytes {
				fmt.Fprintf(&sb, "conversation %d turn %d says %s things. ", id, turn, role)
			}
			sb.WriteString(`"}`)
		}
	}
	sb.WriteString("]")
	return []byte(sb.String())
}

// TestLeastTTFTCountsPromptsSentSinceTheScrape: a replica's KV room is what its last scrape
// showed free less the prompts sent there since; the next scrape starts over.
func TestLeastTTFTCountsPromptsSentSinceTheScrape(t *testing.T) {
	now := time.Unix(1000, 0)
	p := newTTFTPicker(t, Options{Now: func() time.Time { return now }})
	rs := replicas([]int64{0, 1})
	p.Prepare(rs)
	scrape := func(r *Replica) {
		r.SetMetrics(Metrics{Running: 1, KVCacheUsage: 0, CacheTokens: 4096, UpdatedAt: now.UnixNano()})
	}
	scrape(rs[0])
	scrape(rs[1])
	prompt := conversation(2, 0, 3, 1024) // about 1.6k tokens
	var got []int
	for range 3 {
		got = append(got, p.Pick(&Request{Model: []byte("m"), Prompt: prompt}, rs).ID)
	}
	now = now.Add(100 * time.Millisecond)
	scrape(rs[0])
	got = append(got, p.Pick(&Request{Model: []byte("m"), Prompt: prompt}, rs).ID)
	if want := []int{1, 1, 2, 1}; !slices.Equal(got, want) {
		t.Errorf("picked %v, want %v: two prompts fit replica 1's 4,096 tokens, the third goes to replica 2, and a new scrape frees replica 1", got, want)
	}
}

func TestLeastTTFT(t *testing.T) {
	const batch = 4
	tests := map[string]struct {
		// sent is the prompt sent earlier to replica holder (1-based); none when 0.
		holder int
		sent   []byte
		// loads are the replicas' in-flight counts at the pick; batches whether their batch
		// size (batch) is known from their metrics.
		loads     []int64
		knowBatch bool
		// engine, when set, is what each replica's fresh scrape says (its batch and queue).
		engine     []Metrics
		prompt     []byte
		wantID     int
		wantCached bool
	}{
		"no prompt: least load": {
			loads: []int64{2, 0, 1, 3}, prompt: nil, wantID: 2,
		},
		"nothing shared: least load": {
			holder: 1, sent: conversation(1, 2048, 1, 1024),
			loads: []int64{2, 1, 0, 3}, prompt: conversation(2, 0, 3, 1024), wantID: 3,
		},
		"next turn goes where the conversation is": {
			holder: 4, sent: conversation(1, 2048, 2, 2048),
			loads: []int64{1, 1, 1, 1}, prompt: conversation(1, 2048, 3, 2048), wantID: 4, wantCached: true,
		},
		"a cache hit is worth a busier replica within the bound": {
			holder: 2, sent: conversation(1, 2048, 2, 2048),
			loads: []int64{1, 2, 1, 1}, prompt: conversation(1, 2048, 3, 2048), wantID: 2, wantCached: true,
		},
		"over the load bound the holder is not a candidate": {
			holder: 2, sent: conversation(1, 2048, 2, 2048),
			loads: []int64{0, 4, 1, 1}, prompt: conversation(1, 2048, 3, 2048), wantID: 1,
		},
		// The holder would queue behind a full batch (wait ≈ hold / batch = 250 ms by
		// default) to save the prefill of about 1.5k tokens (75 ms by default): not worth it.
		"a short saving does not wait for a full batch": {
			holder: 1, sent: conversation(1, 2048, 1, 2048),
			loads: []int64{4, 3, 4, 4}, knowBatch: true, prompt: conversation(1, 2048, 2, 2048), wantID: 2,
		},
		// The holder has room for this proxy's requests, but its engine reports a queue beside
		// a full batch (another proxy's requests): 7 ahead, about 1.75 s, against a saving of
		// about 2k tokens' prefill.
		"the engine's own queue counts": {
			holder: 1, sent: conversation(1, 2048, 2, 2048),
			loads: []int64{1, 1, 0, 1}, engine: []Metrics{{Running: batch, Waiting: 6}, {Running: 1}, {Running: 0}, {Running: 1}},
			prompt: conversation(1, 2048, 3, 2048), wantID: 3,
		},
		// About 1.6k prompt tokens: replica 1's KV cache has about 400 free, so the request
		// would wait there for a sequence to end, though its batch is not full.
		"nothing shared: least load among replicas with room in the KV cache": {
			loads: []int64{0, 1, 2, 1}, engine: []Metrics{{Running: 3, KVCacheUsage: 0.95, CacheTokens: 8192},
				{Running: 1, KVCacheUsage: 0.2, CacheTokens: 8192}, {Running: 2, KVCacheUsage: 0.3, CacheTokens: 8192}, {Running: 1, KVCacheUsage: 0.2, CacheTokens: 8192}},
			prompt: conversation(2, 0, 3, 1024), wantID: 2,
		},
		// An engine that queues beside a batch it has not filled (its KV cache is full) is full.
		"nothing shared: an engine's queue counts before its batch is known": {
			loads: []int64{0, 1, 2, 1}, engine: []Metrics{{Running: 2, Waiting: 1}, {Running: 1}, {Running: 2}, {Running: 1}},
			prompt: conversation(2, 0, 3, 1024), wantID: 2,
		},
		"nothing shared, no room anywhere: least load": {
			loads: []int64{2, 1, 0, 3}, engine: []Metrics{{Running: 2, KVCacheUsage: 0.99, CacheTokens: 8192},
				{Running: 1, KVCacheUsage: 0.99, CacheTokens: 8192}, {Running: 1, Waiting: 1}, {Running: 3, KVCacheUsage: 0.99, CacheTokens: 8192}},
			prompt: conversation(2, 0, 3, 1024), wantID: 3,
		},
		// Waiting for the holder's batch (250 ms) and prefilling about 5k tokens (250 ms) cost
		// the same within the tolerance: the free replica wins the tie, since a queue's wait is
		// only an estimate and a queued request cannot move.
		"a tie between a queue and a free slot goes to the free slot": {
			holder: 1, sent: conversation(1, 2048, 2, 4500),
			loads: []int64{4, 3, 2, 3}, knowBatch: true, prompt: conversation(1, 2048, 3, 4500), wantID: 3,
		},
		// ... but saving the prefill of about 50k tokens (2.5 s) is.
		"a long saving waits for a full batch": {
			holder: 1, sent: conversation(1, 2048, 4, 50000),
			loads: []int64{4, 3, 3, 4}, knowBatch: true, prompt: conversation(1, 2048, 5, 50000), wantID: 1, wantCached: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			now := time.Unix(1000, 0)
			p := newTTFTPicker(t, Options{Now: func() time.Time { return now }})
			rs := replicas(make([]int64, len(tc.loads)))
			p.Prepare(rs)
			if tc.holder > 0 {
				only := rs[tc.holder-1 : tc.holder]
				p.Pick(&Request{Model: []byte("m"), Prompt: tc.sent}, only)
			}
			for i, r := range rs {
				r.InFlight.Store(tc.loads[i])
				if tc.knowBatch { // seen full long ago: the batch is known, the queue stale
					r.SetMetrics(Metrics{Running: batch, Waiting: 1, UpdatedAt: 1})
				}
				if tc.engine != nil {
					m := tc.engine[i]
					m.UpdatedAt = now.UnixNano()
					r.SetMetrics(m)
				}
			}
			req := &Request{Model: []byte("m"), Prompt: tc.prompt}
			got := p.Pick(req, rs)
			if got.ID != tc.wantID {
				t.Errorf("picked replica %d, want %d", got.ID, tc.wantID)
			}
			if cached := req.Estimate.Cached > 0; cached != tc.wantCached {
				t.Errorf("estimate %+v: cached %v, want %v", req.Estimate, cached, tc.wantCached)
			}
			if want := int64((len(tc.prompt) + 3) / 4); req.Estimate.Tokens != want {
				t.Errorf("estimated %d tokens, want %d", req.Estimate.Tokens, want)
			}
		})
	}
}

// The prefill line is fitted to observed TTFT against uncached tokens; requests expected to
// queue do not count.
func TestLeastTTFTLearnsThePrefillLine(t *testing.T) {
	p := newTTFTPicker(t, Options{})
	rs := replicas([]int64{0, 0})
	p.Prepare(rs)
	const base, rate = 0.020, 100e-6 // 20 ms + 100 µs per uncached token
	for i := range 200 {
		tokens := int64(100 + (i*397)%4000)
		cached := int64(i%3) * cacheBlockTokens
		ttft := time.Duration((base + rate*float64(tokens-cached)) * float64(time.Second))
		p.Learn(rs[i%2], Estimate{Tokens: tokens, Cached: cached}, Outcome{TTFT: ttft, Total: ttft + time.Second, PromptTokens: -1, CachedTokens: -1})
		// Queued requests are left out, however long they took.
		p.Learn(rs[i%2], Estimate{Tokens: tokens, Queued: true}, Outcome{TTFT: 10 * time.Second, Total: 11 * time.Second, PromptTokens: -1, CachedTokens: -1})
	}
	gotBase, gotRate, gotHold := p.pooledLine()
	if math.Abs(gotBase-base) > 1e-4 || math.Abs(gotRate-rate) > 1e-7 {
		t.Errorf("pooled line: base %v rate %v, want %v and %v", gotBase, gotRate, base, rate)
	}
	if gotHold < 1 || gotHold > 1.5 {
		t.Errorf("pooled hold %v s, want between 1 and 1.5", gotHold)
	}
	st := p.state(rs[0])
	b, r, _ := st.line(0, 0, 0)
	if math.Abs(b-base) > 1e-4 || math.Abs(r-rate) > 1e-7 {
		t.Errorf("replica 1's own line: base %v rate %v, want %v and %v", b, r, base, rate)
	}
}

// oneReplicaTTFT returns a least_ttft picker assuming cacheTokens of cache where a replica
// announces none, one idle replica it has prepared, and that replica's state.
func oneReplicaTTFT(t *testing.T, cacheTokens int64) (*leastTTFT, []*Replica, *ttftReplica) {
	p := newTTFTPicker(t, Options{PrefixCacheTokens: cacheTokens})
	rs := replicas([]int64{0})
	p.Prepare(rs)
	return p, rs, p.state(rs[0])
}

// The index is sized by the replica's announced cache (vllm:cache_config_info), and corrected
// by its hit counters: an index that expects hits the engine does not find shrinks, and grows
// back when the two agree.
func TestLeastTTFTCacheSizeAndCorrection(t *testing.T) {
	p, rs, st := oneReplicaTTFT(t, cacheBlockTokens*2000)
	r := rs[0]
	if _, limit := st.cache.size(); limit != 2000 {
		t.Fatalf("configured: limit %d blocks, want 2000", limit)
	}
	var updated int64
	var queries, hits float64
	scrape := func() {
		updated++
		r.SetMetrics(Metrics{CacheTokens: cacheBlockTokens * 1000, PrefixQueries: queries, PrefixHits: hits, UpdatedAt: updated})
	}
	scrape()
	prompt := conversation(1, 0, 8, 2048) // ~32k bytes, ~8k tokens, the same every time
	req := &Request{Model: []byte("m"), Prompt: prompt}
	p.Pick(req, rs)
	if _, limit := st.cache.size(); limit != 1000 {
		t.Fatalf("announced 1000 blocks' worth: limit %d blocks, want 1000", limit)
	}
	// The engine finds nothing of what the index expects to be cached.
	for range 200 {
		p.Pick(req, rs)
		queries += float64(req.Estimate.Tokens)
		scrape()
	}
	_, shrunk := st.cache.size()
	if shrunk >= 1000 || shrunk < 1000/8 {
		t.Fatalf("after the engine found no hits: limit %d, want below 1000 and at least 1000/8", shrunk)
	}
	// Now it finds what the index expects.
	for range 400 {
		p.Pick(req, rs)
		queries += float64(req.Estimate.Tokens)
		hits += float64(req.Estimate.Cached)
		scrape()
	}
	if _, limit := st.cache.size(); limit != 1000 {
		t.Errorf("after the engine agreed: limit %d, want back to 1000", limit)
	}
}

// Where answers report the engine's cached tokens, they correct the index instead of the
// counters (which may be absent, or count other proxies' requests): an engine that finds none
// of what the index expects shrinks it, and agreement grows it back. Counters that say the
// opposite are not heeded once reports arrive.
func TestLeastTTFTCorrectsFromReportedCachedTokens(t *testing.T) {
	p, rs, st := oneReplicaTTFT(t, cacheBlockTokens*1000)
	r := rs[0]
	req := &Request{Model: []byte("m"), Prompt: conversation(1, 0, 8, 2048)}
	var updated int64
	for i := range 200 {
		p.Pick(req, rs)
		if req.Estimate.Cached == 0 && i > 0 {
			t.Fatalf("pick %d: the index expects nothing of a prompt it was just sent", i)
		}
		p.Learn(r, req.Estimate, Outcome{TTFT: time.Millisecond, Total: time.Second, PromptTokens: req.Estimate.Tokens, CachedTokens: 0})
		updated++ // counters that agree with the index, which the reports override
		r.SetMetrics(Metrics{PrefixQueries: float64(updated * req.Estimate.Tokens), PrefixHits: float64(updated * req.Estimate.Tokens), UpdatedAt: updated})
	}
	_, shrunk := st.cache.size()
	if shrunk >= 1000 || shrunk < 1000/8 {
		t.Fatalf("after reports of no hits: limit %d, want below 1000 and at least 1000/8", shrunk)
	}
	for range 400 {
		p.Pick(req, rs)
		p.Learn(r, req.Estimate, Outcome{TTFT: time.Millisecond, Total: time.Second, PromptTokens: req.Estimate.Tokens, CachedTokens: req.Estimate.Cached})
	}
	if _, limit := st.cache.size(); limit != 1000 {
		t.Errorf("after reports that agree: limit %d, want back to 1000", limit)
	}
}

// The line is fitted to the uncached tokens the engine reports, not to the index's guess: an
// index that guessed nothing cached still learns the engine's true prefill rate.
func TestLeastTTFTFitsReportedUncachedTokens(t *testing.T) {
	p := newTTFTPicker(t, Options{})
	rs := replicas([]int64{0})
	p.Prepare(rs)
	const base, rate = 0.010, 50e-6
	for i := range 200 {
		tokens := int64(500 + (i*397)%4000)
		cached := tokens * int64(i%4) / 4 // the engine found a quarter, half, ... cached
		ttft := time.Duration((base + rate*float64(tokens-cached)) * float64(time.Second))
		p.Learn(rs[0], Estimate{Tokens: tokens}, Outcome{TTFT: ttft, Total: 2 * ttft, PromptTokens: tokens, CachedTokens: cached})
	}
	gotBase, gotRate, _ := p.pooledLine()
	if math.Abs(gotBase-base) > 1e-4 || math.Abs(gotRate-rate) > 1e-7 {
		t.Errorf("pooled line: base %v rate %v, want %v and %v", gotBase, gotRate, base, rate)
	}
}

// What a starved proxy measures does not make the learned figures absurd: TTFTs of tens of
// seconds for small prompts, and answers held for hours, stay within the bounds.
func TestLeastTTFTBoundsWhatItLearns(t *testing.T) {
	p := newTTFTPicker(t, Options{})
	rs := replicas([]int64{0})
	p.Prepare(rs)
	for i := range 200 {
		tokens := int64(100 + (i*397)%4000)
		ttft := time.Duration(float64(tokens)*0.05*float64(time.Second)) + 30*time.Second // 50 ms per token, 30 s base
		p.Learn(rs[0], Estimate{Tokens: tokens}, Outcome{TTFT: ttft, Total: 5 * time.Hour, PromptTokens: -1, CachedTokens: -1})
	}
	base, rate, hold := p.pooledLine()
	if base > maxBaseSeconds || rate > maxPrefillSecondsPerToken || hold > maxHoldSeconds {
		t.Errorf("learned base %v s, rate %v s/token, hold %v s: want at most %v, %v and %v",
			base, rate, hold, maxBaseSeconds, maxPrefillSecondsPerToken, maxHoldSeconds)
	}
}

// The batch size is learned from the metrics: the largest running count seen while requests
// waited.
func TestLeastTTFTLearnsTheBatch(t *testing.T) {
	p := newTTFTPicker(t, Options{})
	rs := replicas([]int64{0})
	p.Prepare(rs)
	st := p.state(rs[0])
	for i, m := range []Metrics{
		{Running: 12, Waiting: 0}, // room to spare: not full
		{Running: 6, Waiting: 2},
		{Running: 8, Waiting: 1},
		{Running: 7, Waiting: 3}, // a smaller count never lowers it
	} {
		m.UpdatedAt = int64(i + 1)
		rs[0].SetMetrics(m)
		p.Pick(&Request{}, rs)
	}
	if got := st.batch.Load(); got != 8 {
		t.Errorf("batch %d, want 8", got)
	}
}

// Under a steady stream of requests that all share one long prefix, no replica holds more
// than the bound at any pick, nor more than 1.25 × the mean over time.
func TestLeastTTFTBoundsLoad(t *testing.T) {
	p := newTTFTPicker(t, Options{})
	rs := replicas(make([]int64, 4))
	p.Prepare(rs)
	shared := conversation(0, 8192, 1, 64) // every request shares an 8 KiB prefix
	var held []*Replica
	busy := make([]float64, len(rs))
	for i := range 2000 {
		var total int64
		for _, r := range rs {
			total += r.InFlight.Load()
		}
		mean := float64(total+1) / 4
		r := p.Pick(&Request{Model: []byte("m"), Prompt: shared}, rs)
		if load := r.InFlight.Add(1); float64(load) > max(1.25*mean, mean+2) {
			t.Fatalf("pick %d: replica %d now holds %d, over the bound (mean %.2f)", i, r.ID, load, mean)
		}
		held = append(held, r)
		if len(held) > 24 { // 24 in flight: the oldest finishes
			held[0].InFlight.Add(-1)
			held = held[1:]
		}
		for j, r := range rs {
			busy[j] += float64(r.InFlight.Load())
		}
	}
	var sum, top float64
	for _, b := range busy {
		sum += b
		top = max(top, b)
	}
	if imbalance := top / (sum / 4); imbalance > 1.25 {
		t.Errorf("in flight over time, max/mean %.2f, want at most 1.25 (%v)", imbalance, busy)
	}
}

func TestLeastTTFTIsSafeConcurrently(t *testing.T) {
	p := newTTFTPicker(t, Options{Rand: seeded(3)})
	rs := replicas(make([]int64, 4))
	var wg sync.WaitGroup
	var scrapes atomic.Int64
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				req := &Request{Model: []byte("m"), Prompt: conversation(g*1000+i%7, 1024, 1+i%5, 512)}
				r := p.Pick(req, rs)
				r.SetMetrics(Metrics{Running: 4, Waiting: int64(i % 2), CacheTokens: 1 << 16,
					PrefixQueries: float64(i * 1000), PrefixHits: float64(i * 300), UpdatedAt: scrapes.Add(1)})
				p.Learn(r, req.Estimate, Outcome{TTFT: time.Duration(i) * time.Millisecond, Total: time.Second, PromptTokens: 2000, CachedTokens: int64(i % 2000)})
				if i%50 == 0 {
					p.Prepare(rs)
				}
			}
		}()
	}
	wg.Wait()
}

// BenchmarkLeastTTFTPick is the pick with the index for a 4k-token prompt (16 KiB of messages
// JSON), on 4 replicas (8 for the _8_replicas cases): "hit" picks the next turn of 64
// conversations whose history the index holds (the common case), "miss" a prompt the index
// has never seen, so every block is new.
func BenchmarkLeastTTFTPick(b *testing.B) {
	const conversations = 64
	prompts := make([][]byte, conversations)
	for i := range prompts {
		prompts[i] = conversation(i, 2048, 4, 1800) // about 16.5 KiB, 4.1k tokens
	}
	for _, name := range []string{"hit", "miss", "hit_8_replicas", "miss_8_replicas"} {
		mode, _, eight := strings.Cut(name, "_")
		b.Run(name, func(b *testing.B) {
			p := newTTFTPicker(b, Options{})
			loads := []int64{3, 2, 4, 3}
			if eight {
				loads = append(loads, 2, 3, 4, 3)
			}
			rs := replicas(loads)
			for _, r := range rs {
				r.SetMetrics(Metrics{Running: 8, Waiting: 1, CacheTokens: 1 << 20, UpdatedAt: 1})
			}
			p.Prepare(rs)
			req := &Request{Model: []byte("m")}
			for _, prompt := range prompts {
				req.Prompt = prompt
				p.Pick(req, rs)
			}
			fresh := make([]byte, len(prompts[0]))
			copy(fresh, prompts[0])
			b.SetBytes(int64(len(prompts[0])))
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if mode == "hit" {
					req.Prompt = prompts[i%conversations]
				} else {
					// A new first block makes every block of the chain new.
					fresh[30] = byte('a' + i%26)
					fresh[31] = byte('a' + (i/26)%26)
					fresh[32] = byte('a' + (i/676)%26)
					req.Prompt = fresh
				}
				i++
				if p.Pick(req, rs) == nil {
					b.Fatal("nil pick")
				}
			}
		})
	}
}

// The proxy hands the picker the clock reading it took for the attempt (Request.Now); the
// engines' reports are judged fresh or stale at that time, and at the picker's own clock only
// without it. The engine's queue on the prefix holder (as in "the engine's own queue counts")
// decides the pick only while its report is fresh.
func TestLeastTTFTJudgesStalenessAtTheRequestsTime(t *testing.T) {
	const batch = 4 // as in TestLeastTTFT
	reported := time.Unix(1000, 0)
	later := reported.Add(time.Hour) // the picker's own clock: every report is stale by then
	for name, tc := range map[string]struct {
		now    time.Time
		wantID int
	}{
		"fresh at the request's time": {now: reported, wantID: 3},
		"stale at the picker's clock": {wantID: 1},
	} {
		t.Run(name, func(t *testing.T) {
			p := newTTFTPicker(t, Options{Now: func() time.Time { return later }})
			rs := replicas(make([]int64, 4))
			p.Prepare(rs)
			p.Pick(&Request{Model: []byte("m"), Prompt: conversation(1, 2048, 2, 2048)}, rs[:1])
			for i, m := range []Metrics{{Running: batch, Waiting: 6}, {Running: 1}, {Running: 0}, {Running: 1}} {
				rs[i].InFlight.Store([]int64{1, 1, 0, 1}[i])
				m.UpdatedAt = reported.UnixNano()
				rs[i].SetMetrics(m)
			}
			req := &Request{Model: []byte("m"), Prompt: conversation(1, 2048, 3, 2048), Now: tc.now}
			if got := p.Pick(req, rs); got.ID != tc.wantID {
				t.Errorf("picked replica %d, want %d", got.ID, tc.wantID)
			}
		})
	}
}

// The KV-room rule reads only a fresh report: a replica whose cache its last scrape showed full
// has a request ahead while that scrape is under DefaultMetricsStaleAfter old, and is judged by
// its in-flight count alone once the scrape is stale (its /metrics erred or hung since).
func TestLeastTTFTReadsKVRoomOnlyFromAFreshScrape(t *testing.T) {
	reported := time.Unix(1000, 0)
	for name, tc := range map[string]struct {
		now    time.Time
		wantID int
	}{
		"fresh: the full cache has a request ahead": {now: reported.Add(DefaultMetricsStaleAfter / 2), wantID: 2},
		"stale: the least loaded":                   {now: reported.Add(2 * DefaultMetricsStaleAfter), wantID: 1},
	} {
		t.Run(name, func(t *testing.T) {
			p := newTTFTPicker(t, Options{Now: func() time.Time { return tc.now }})
			rs := replicas([]int64{0, 1})
			p.Prepare(rs)
			rs[0].SetMetrics(Metrics{Running: 3, KVCacheUsage: 1, CacheTokens: 4096, UpdatedAt: reported.UnixNano()})
			rs[1].SetMetrics(Metrics{Running: 1, KVCacheUsage: 0.1, CacheTokens: 4096, UpdatedAt: reported.UnixNano()})
			req := &Request{Model: []byte("m"), Prompt: conversation(3, 0, 1, 1024), Now: tc.now}
			if got := p.Pick(req, rs); got.ID != tc.wantID {
				t.Errorf("picked replica %d, want %d", got.ID, tc.wantID)
			}
		})
	}
}
