package sim

import (
	"math"
	"testing"
	"time"
)

// testModel has round numbers: prefill 0.1 s + 1 ms/token, decode 10 ms + 1 ms/sequence.
func testModel() Model {
	return Model{
		MaxSeqs:          4,
		KVCapacityTokens: 1000,
		MaxBatchedTokens: 1000,
		PrefillBase:      100 * time.Millisecond,
		PrefillPerToken:  time.Millisecond,
		DecodeBase:       10 * time.Millisecond,
		DecodePerSeq:     time.Millisecond,
	}
}

// finished records what an engine hands back.
type finished struct {
	reqs []*request
	at   []float64
}

func (f *finished) done(r *request, at float64) {
	f.reqs = append(f.reqs, r)
	f.at = append(f.at, at)
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// submitTogether queues reqs at once, so that they are prefilled in one step (submit would
// start a prefill for the first alone).
func submitTogether(e *engine, reqs ...*request) {
	e.waiting = append(e.waiting, reqs...)
	e.schedule()
}

func TestSimEngineSingleRequest(t *testing.T) {
	m := testModel()
	var f finished
	e := newEngine(&m, 0, f.done)
	r := &request{ctx: 100, gen: 11}
	e.submit(r)
	e.advance(10)
	if len(f.reqs) != 1 {
		t.Fatalf("%d requests finished, want 1", len(f.reqs))
	}
	// Prefill 0.1 + 100 × 0.001 = 0.2 s gives the first token; 10 more tokens at 11 ms each.
	if !near(r.firstToken, 0.2) || !near(f.at[0], 0.2+10*0.011) {
		t.Errorf("first token at %v, done at %v; want 0.2 and 0.31", r.firstToken, f.at[0])
	}
	if e.inFlight() != 0 || e.reserved != 0 || e.kvTokens() != 0 {
		t.Errorf("engine not empty after the request: in flight %d, reserved %d, kv %v", e.inFlight(), e.reserved, e.kvTokens())
	}
}

func TestSimEngineTTFTGrowsWithQueue(t *testing.T) {
	m := testModel()
	m.KVCapacityTokens = 300 // one 100+100-token request at a time
	var f finished
	e := newEngine(&m, 0, f.done)
	var reqs []*request
	for range 5 {
		r := &request{ctx: 100, gen: 100}
		reqs = append(reqs, r)
		e.submit(r)
	}
	if got := e.queued(); got != 4 {
		t.Errorf("queued = %d after 5 submissions with room for one, want 4", got)
	}
	e.advance(100)
	if len(f.reqs) != 5 {
		t.Fatalf("%d finished, want 5", len(f.reqs))
	}
	for i := 1; i < len(reqs); i++ {
		if reqs[i].firstToken <= reqs[i-1].firstToken {
			t.Errorf("request %d's first token at %v, not after request %d's at %v", i, reqs[i].firstToken, i-1, reqs[i-1].firstToken)
		}
	}
	// Served one after another: each waits for the previous one's prefill and 99 decode steps.
	perRequest := 0.2 + 99*0.011
	if !near(reqs[4].firstToken, 4*perRequest+0.2) {
		t.Errorf("fifth first token at %v, want %v", reqs[4].firstToken, 4*perRequest+0.2)
	}
}

func TestSimEngineBatchCap(t *testing.T) {
	m := testModel()
	m.MaxSeqs = 2
	m.KVCapacityTokens = 100000
	var f finished
	e := newEngine(&m, 0, f.done)
	maxBatch := 0
	for range 7 {
		e.submit(&request{ctx: 10, gen: 50})
	}
	for step := 0.0; step < 60; step += 0.005 {
		e.advance(step)
		maxBatch = max(maxBatch, len(e.running)+len(e.prefill))
		if e.inFlight() == 0 {
			break
		}
	}
	if maxBatch != 2 {
		t.Errorf("largest batch %d, want the cap 2", maxBatch)
	}
	if len(f.reqs) != 7 {
		t.Errorf("%d finished, want 7", len(f.reqs))
	}
}

func TestSimEngineDecodeSlowsWithBatch(t *testing.T) {
	m := testModel()
	// A decode step of n sequences takes 10 ms + n × 1 ms (the KV term is 0 in testModel).
	tpot := func(n int) float64 {
		var f finished
		e := newEngine(&m, 0, f.done)
		var reqs []*request
		for range n {
			reqs = append(reqs, &request{ctx: 10, gen: 101})
		}
		submitTogether(e, reqs...)
		e.advance(100)
		return (f.at[0] - reqs[0].firstToken) / 100
	}
	if one, four := tpot(1), tpot(4); !near(one, 0.011) || !near(four, 0.014) {
		t.Errorf("TPOT with 1 and 4 sequences = %v and %v, want 0.011 and 0.014", one, four)
	}
}

func TestSimEngineKVUsageAndKill(t *testing.T) {
	m := testModel()
	var f finished
	e := newEngine(&m, 0, f.done)
	submitTogether(e, &request{ctx: 200, gen: 101}, &request{ctx: 300, gen: 101})
	// Both prefill together: 0.1 + 0.5 = 0.6 s; then 50 steps of 12 ms.
	e.advance(0.6 + 50*0.012)
	// Each holds its prompt, its first token and 50 more.
	if want := (200 + 300 + 2*51) / 1000.0; !near(e.kvUsage(), want) {
		t.Errorf("KV usage %v, want %v", e.kvUsage(), want)
	}
	if got := e.kill(); len(got) != 2 || e.inFlight() != 0 || e.reserved != 0 {
		t.Errorf("kill returned %d requests, left %d in flight and %d reserved", len(got), e.inFlight(), e.reserved)
	}
	if len(f.reqs) != 0 {
		t.Errorf("killed requests were reported finished")
	}
}

func TestSimDefaultModelIsValid(t *testing.T) {
	if err := DefaultModel().Validate(); err != nil {
		t.Fatal(err)
	}
	bad := DefaultModel()
	bad.MaxSeqs, bad.DecodeBase = 0, 0
	if err := bad.Validate(); err == nil {
		t.Error("Validate accepted MaxSeqs 0 and DecodeBase 0")
	}
}

func TestSimEnginePrefillStallsDecode(t *testing.T) {
	m := testModel()
	var f finished
	e := newEngine(&m, 0, f.done)
	first := &request{ctx: 10, gen: 101}
	e.submit(first)
	e.advance(1)
	// A second request arrives mid-decode: its prefill (0.1 + 0.5 s) stops the first's decode.
	e.submit(&request{ctx: 500, gen: 2})
	e.advance(100)
	// 0.11 s prefill; 100 steps, most at 11 ms and two at 12 ms; plus the 0.6 s stall.
	tpot := (f.at[1] - first.firstToken) / 100
	if tpot < 0.011+0.6/100 {
		t.Errorf("TPOT %v does not include the 0.6 s prefill stall", tpot)
	}
}

// TestSimEngineReportsPrefillsLikeVLLM: vLLM counts a request being prefilled as running and
// holds its prompt's KV blocks from the moment it schedules it; the learned in-flight target
// divides the one by the other.
func TestSimEngineReportsPrefillsLikeVLLM(t *testing.T) {
	m := testModel()
	var f finished
	e := newEngine(&m, 0, f.done)
	e.submit(&request{ctx: 200, gen: 11})
	e.advance(0.1) // mid-prefill (0.3 s)
	if e.batch() != 1 || !near(e.kvUsage(), 0.2) {
		t.Errorf("mid-prefill: batch %d, KV use %v; want 1 and 200/1000", e.batch(), e.kvUsage())
	}
	// Prefilled at 0.3 s with its first token; 5 ms later 0.45 of an 11 ms decode step is done.
	e.advance(0.305)
	if want := (201 + 0.005/0.011) / 1000; e.batch() != 1 || math.Abs(e.kvUsage()-want) > 1e-6 {
		t.Errorf("decoding: batch %d, KV use %v; want 1 and %v", e.batch(), e.kvUsage(), want)
	}
	e.advance(10)
	if e.batch() != 0 || e.kvUsage() != 0 {
		t.Errorf("done: batch %d, KV use %v; want 0 and 0", e.batch(), e.kvUsage())
	}
}

func TestSimEngineRoomFor(t *testing.T) {
	m := testModel() // 1,000 KV tokens, 4 sequences
	e := newEngine(&m, 0, (&finished{}).done)
	long := &request{ctx: 600, gen: 300}
	e.submit(long)
	// Prefilling, the prompt's 600 tokens count: 400 left.
	if !e.roomFor(&request{ctx: 400, gen: 1}) || e.roomFor(&request{ctx: 401, gen: 1}) {
		t.Errorf("room with 600 of 1,000 tokens used: want room for a 400-token prompt and not a 401-token one")
	}
	// A request the engine cannot start waits there: no room for anything behind it.
	e.submit(&request{ctx: 500, gen: 10})
	if e.queued() != 1 || e.roomFor(&request{ctx: 1, gen: 1}) {
		t.Errorf("queued %d: want 1, and no room behind it", e.queued())
	}
}
