package policy

import (
	"testing"
	"time"
)

// tokens returns n token ids, those at i >= from offset by salt, so two calls share exactly
// their first from ids.
func tokens(n, from int, salt uint32) []uint32 {
	ids := make([]uint32, n)
	for i := range ids {
		ids[i] = uint32(i*7 + 3)
		if i >= from {
			ids[i] += salt
		}
	}
	return ids
}

// store reports ids to k as an engine would: one BlockStored per call, engine hashes taken from
// base, the first block parented by parent when hasParent.
func store(k *KVBlocks, base uint64, parent uint64, hasParent bool, ids []uint32, blockSize int) []uint64 {
	hashes := make([]uint64, len(ids)/blockSize)
	for i := range hashes {
		hashes[i] = base + uint64(i)
	}
	k.Stored(parent, hasParent, hashes, ids[:len(hashes)*blockSize], blockSize)
	return hashes
}

func TestKVBlocksFollowsTheEngine(t *testing.T) {
	const bs = 16
	ids := tokens(160, 160, 0) // 10 blocks
	chain := tokenChain(nil, ids, bs)
	k := NewKVBlocks()
	if k.Live() || k.depth(chain, 0) != 0 {
		t.Fatal("a new index is live or holds blocks")
	}

	// Stored in two events, the second parented by the first's last block.
	first := store(k, 100, 0, false, ids[:4*bs], bs)
	store(k, 200, first[3], true, ids[4*bs:], bs)
	if !k.Live() || k.BlockSize() != bs {
		t.Fatalf("live %v, block size %d", k.Live(), k.BlockSize())
	}
	if got := k.depth(chain, 0); got != 10 {
		t.Fatalf("depth after storing 10 blocks = %d", got)
	}
	// A prompt sharing 5 blocks and a bit matches 5.
	other := tokenChain(nil, tokens(160, 5*bs+3, 1), bs)
	if got := k.depth(other, 0); got != 5 {
		t.Fatalf("depth of a prompt sharing 5 blocks = %d", got)
	}

	// Eviction from the end shortens the chain.
	k.Removed([]uint64{205, 204, 203})
	if got := k.depth(chain, 0); got != 7 {
		t.Fatalf("depth after removing the last 3 = %d", got)
	}
	// Unknown hashes are ignored.
	k.Removed([]uint64{999})
	if held, _ := k.Len(); held != 7 {
		t.Fatalf("held %d blocks, want 7", held)
	}

	// A block whose parent the index never heard of cannot be chained.
	store(k, 300, 12345, true, ids[:2*bs], bs)
	if k.Orphans() != 2 {
		t.Fatalf("orphans = %d, want 2", k.Orphans())
	}

	k.Cleared()
	if got := k.depth(chain, 0); got != 0 || !k.Live() {
		t.Fatalf("after AllBlocksCleared depth %d live %v", got, k.Live())
	}

	// A new block size is a new engine: what the old one reported goes.
	store(k, 100, 0, false, ids, bs)
	store(k, 500, 0, false, ids, 32)
	if got := k.depth(chain, 0); got != 0 {
		t.Fatalf("16-token chain matched %d blocks after the engine changed to 32-token blocks", got)
	}
	if got := k.depth(tokenChain(nil, ids, 32), 0); got != 5 {
		t.Fatalf("32-token chain depth = %d, want 5", got)
	}

	// A malformed event (fewer ids than blocks) stores what it can and no more.
	k.Cleared()
	k.Stored(0, false, []uint64{1, 2, 3}, ids[:40], 16)
	if held, _ := k.Len(); held != 2 {
		t.Fatalf("held %d blocks of a short event, want 2", held)
	}
}

func TestKVBlocksClaimsLapse(t *testing.T) {
	const bs = 16
	k := NewKVBlocks()
	store(k, 1, 0, false, tokens(16, 16, 0), bs) // live, holding one block
	chain := tokenChain(nil, tokens(64, 0, 9), bs)
	now := time.Now().UnixNano()
	k.claim(chain, now)
	if got := k.depth(chain, now+1); got != 4 {
		t.Fatalf("claimed chain depth = %d, want 4", got)
	}
	if got := k.depth(chain, now+claimNanos+1); got != 0 {
		t.Fatalf("expired claim still counts: depth %d", got)
	}
	// The engine's event confirms a claim: it no longer lapses.
	k.claim(chain, now)
	store(k, 50, 0, false, tokens(64, 0, 9), bs)
	if _, claims := k.Len(); claims != 0 {
		t.Fatalf("%d claims left after the engine confirmed them", claims)
	}
	if got := k.depth(chain, now+claimNanos+1); got != 4 {
		t.Fatalf("confirmed chain depth = %d, want 4", got)
	}
}

// TestLeastTTFTPrefersTheEnginesReport checks that where replicas report their caches, the
// pick follows the reports and not the byte index: the byte index says replica 1 was sent the
// prompt, the engines say replica 2 holds it (the engine 1 evicted it, another proxy sent it to 2).
func TestLeastTTFTPrefersTheEnginesReport(t *testing.T) {
	const bs = 16
	clock := time.Unix(1000, 0)
	p := newTTFTPicker(t, Options{Now: func() time.Time { return clock }})
	rs := replicas([]int64{0, 0, 0})
	p.Prepare(rs)
	prompt := conversation(1, 2048, 4, 1800)
	ids := tokens(len(prompt)/4, len(prompt)/4, 0)

	// Without token ids, the byte index decides: the prompt goes where it went before.
	req := &Request{Model: []byte("m"), Prompt: prompt}
	first := p.Pick(req, rs)
	if again := p.Pick(req, rs); again != first {
		t.Fatalf("byte index: follow-up went to %d, not %d", again.ID, first.ID)
	}

	holder := rs[(first.ID)%3] // another replica than the byte index's
	for _, r := range rs {
		k := NewKVBlocks()
		if r == holder {
			store(k, 1, 0, false, ids, bs)
		} else {
			store(k, 1, 0, false, tokens(16, 0, 77), bs) // live, holding something else
		}
		r.SetKV(k)
	}
	req = &Request{Model: []byte("m"), Prompt: prompt, Tokens: ids}
	if got := p.Pick(req, rs); got != holder {
		t.Fatalf("with the engines' reports the prompt went to %d, the engine holding it is %d", got.ID, holder.ID)
	}
	if !req.Estimate.Precise || req.Estimate.Tokens != int64(len(ids)) || req.Estimate.Cached != int64(len(ids)/bs*bs) {
		t.Fatalf("estimate %+v, want precise with %d of %d tokens cached", req.Estimate, len(ids)/bs*bs, len(ids))
	}

	// A new prompt's blocks are claimed on the replica it went to, so that the next request
	// sharing them follows before the engine reports them.
	fresh := tokens(len(ids), 0, 5)
	req = &Request{Model: []byte("m"), Prompt: []byte(`"x"`), Tokens: fresh}
	to := p.Pick(req, rs)
	req = &Request{Model: []byte("m"), Prompt: []byte(`"y"`), Tokens: fresh}
	if again := p.Pick(req, rs); again != to {
		t.Fatalf("the follow-up of a claimed prompt went to %d, not %d", again.ID, to.ID)
	}
	if req.Estimate.Cached == 0 {
		t.Fatal("a claimed prompt was estimated uncached")
	}

	// A replica whose engine never reported keeps the byte index.
	rs[0].SetKV(NewKVBlocks())
	req = &Request{Model: []byte("m"), Prompt: prompt, Tokens: ids}
	var exact tokenMatch
	exact.req = req
	if _, precise := exact.cached(rs[0], clock.UnixNano()); precise {
		t.Fatal("an engine that never reported was taken as precise")
	}
}

// TestLeastTTFTPreciseLeavesTheByteIndexAlone checks that an answer whose estimate came from
// the engine's report does not resize the byte index (whose guess it was not).
func TestLeastTTFTPreciseLeavesTheByteIndexAlone(t *testing.T) {
	p, rs, st := oneReplicaTTFT(t, 1<<20)
	before := st.cache.limit
	for range 64 {
		p.Learn(rs[0], Estimate{Tokens: 4096, Cached: 4096, Precise: true},
			Outcome{TTFT: 10 * time.Millisecond, Total: time.Second, PromptTokens: 4096, CachedTokens: 0})
	}
	if st.cache.limit != before || st.reported {
		t.Fatalf("precise estimates resized the byte index: limit %d -> %d, reported %v", before, st.cache.limit, st.reported)
	}
}

// BenchmarkLeastTTFTPickTokens is BenchmarkLeastTTFTPick's "hit" with token ids and the
// engines' reports: the cost of cutting 4k token ids into 16-token blocks and matching them.
func BenchmarkLeastTTFTPickTokens(b *testing.B) {
	const conversations, bs = 64, 16
	p := newTTFTPicker(b, Options{})
	rs := replicas([]int64{3, 2, 4, 3})
	for _, r := range rs {
		r.SetKV(NewKVBlocks())
	}
	p.Prepare(rs)
	reqs := make([]*Request, conversations)
	for i := range reqs {
		ids := tokens(4096, 512, uint32(i+1))
		reqs[i] = &Request{Model: []byte("m"), Tokens: ids}
		store(rs[i%len(rs)].KV(), uint64(i)<<20, 0, false, ids, bs)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if p.Pick(reqs[i%conversations], rs) == nil {
			b.Fatal("nil pick")
		}
		i++
	}
}
