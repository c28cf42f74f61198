package policy

import (
	"fmt"
	"math/bits"
	"sync"

	"github.com/cespare/xxhash/v2"
	"github.com/hashicorp/golang-lru/v2/simplelru"
)

const (
	// prefixBlockBytes is how much prompt makes one block: vLLM caches KV in 16-token blocks,
	// and without a tokenizer 4 bytes per token is the usual estimate (llm-d's approximate
	// prefix scorer makes the same one). Only whole blocks count, as in vLLM.
	prefixBlockBytes = 64
	// maxPrefixBlocks bounds the work per request: 128 blocks are the first 8 KiB of the prompt
	// (about 2k tokens), which covers system prompts, tool definitions and the first turns of a
	// conversation. Prompts that agree on their first 8 KiB are treated as sharing all of it.
	maxPrefixBlocks = 128
	// holderSlots is the number of distinct replicas one block can remember (see holderBit).
	holderSlots = 64
)

// prefixIndex is Ferry's approximate picture of which replica holds which prompt prefix in its
// KV cache, shared by prefix_affinity and llm_aware. Nothing is asked of the replicas: the
// index remembers where the proxy sent each prompt, as llm-d's approximate prefix scorer does.
//
// A prompt is cut into 64-byte blocks and each block is named by a chained hash: xxhash64 of the
// block seeded with the previous block's hash, the first seeded with the model's hash. A block's
// hash thus names the whole prefix up to and including it, so "replica R served block i" means
// R has seen blocks 0..i, and different models never share blocks (nor KV caches).
//
// The index maps a block hash to the set of replicas that were sent it, as a 64-bit set indexed
// by replica ID mod 64 (holderBit). A set, not the last replica, because a popular prefix (a
// shared system prompt) ends up cached on many replicas, and routing should be free to choose
// the least loaded of them. Replica IDs are allocated sequentially and never reused, so two live
// replicas share a slot only when their IDs are 64 apart; the cost of that is a mistaken
// affinity guess, never a wrong pick, because the load bound and the snapshot still decide.
//
// The map is a bounded LRU (golang-lru's simplelru) under one mutex, taken twice per pick:
// once to walk the prompt's blocks, once to record them. One lock per walk costs less than a
// lock per block on a sharded cache (each lock is a contended cache line), and a pick holds it
// for about a microsecond, so one index serves hundreds of thousands of picks per second, far
// beyond an LLM service's request rate. Recency matters for correctness, not just for memory: a
// lookup stops at the first missing block, so a prompt's first block must outlive its later
// ones. record therefore touches a prompt's blocks from last to first.
//
// The walk and the record are separate critical sections, with the decision in between; two
// concurrent picks of the same block may lose one of their holder bits, which only makes the
// picture a little less complete.
type prefixIndex struct {
	mu     sync.Mutex
	blocks *simplelru.LRU[uint64, uint64] // block hash → holder set
}

func newPrefixIndex(blocks int) (*prefixIndex, error) {
	cache, err := simplelru.NewLRU[uint64, uint64](blocks, nil)
	if err != nil {
		return nil, fmt.Errorf("prefix cache of %d blocks: %w", blocks, err)
	}
	return &prefixIndex{blocks: cache}, nil
}

// prefixMatch is one request's view of the index. It lives on the picking goroutine's stack
// (about 2 KiB), so a pick allocates nothing for it.
type prefixMatch struct {
	// blocks is the number of whole blocks hashed, at most maxPrefixBlocks.
	blocks int
	// matched is how many leading blocks the index knows.
	matched int
	hashes  [maxPrefixBlocks]uint64
	// held[i] is the holder set of block i, for i < matched.
	held [maxPrefixBlocks]uint64
	// depth[slot] is the number of leading blocks held by the replica in that holder slot.
	depth [holderSlots]uint8
}

// holderBit is a replica's slot in a block's holder set.
func holderBit(r *Replica) uint64 { return 1 << (uint(r.ID) % holderSlots) }

// lookup hashes the prompt's leading blocks into m and finds, for every replica slot, how many
// leading blocks that replica was sent.
func (ix *prefixIndex) lookup(m *prefixMatch, model, prompt []byte) {
	m.blocks = hashBlocks(&m.hashes, model, prompt)
	m.matched = 0
	ix.mu.Lock()
	for i := range m.blocks {
		held, ok := ix.blocks.Peek(m.hashes[i])
		if !ok || held == 0 {
			break
		}
		m.held[i] = held
		m.matched++
	}
	ix.mu.Unlock()
	// A replica's depth is the deepest block it holds: with chained hashes, holding block i
	// means having been sent blocks 0..i. Walking from the deepest block, the first time a slot
	// appears gives its depth.
	m.depth = [holderSlots]uint8{}
	var seen uint64
	for i := m.matched - 1; i >= 0 && seen != ^uint64(0); i-- {
		for fresh := m.held[i] &^ seen; fresh != 0; fresh &= fresh - 1 {
			m.depth[bits.TrailingZeros64(fresh)] = uint8(i + 1)
		}
		seen |= m.held[i]
	}
}

// depthOf returns how many leading blocks of the prompt r was sent.
func (m *prefixMatch) depthOf(r *Replica) int {
	return int(m.depth[uint(r.ID)%holderSlots])
}

// fraction returns the share of the prompt's blocks that r was sent, 0 to 1; 0 for a prompt
// shorter than one block.
func (m *prefixMatch) fraction(r *Replica) float64 {
	if m.blocks == 0 {
		return 0
	}
	return float64(m.depthOf(r)) / float64(m.blocks)
}

// record notes that r was sent the prompt of m: every block now has r among its holders. It
// touches the blocks from last to first so that the first blocks are the most recently used
// (see prefixIndex).
func (ix *prefixIndex) record(m *prefixMatch, r *Replica) {
	bit := holderBit(r)
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for i := m.blocks - 1; i >= 0; i-- {
		held := bit
		if i < m.matched {
			held |= m.held[i]
		}
		ix.blocks.Add(m.hashes[i], held)
	}
}

// hashBlocks fills dst with the chained hashes of the prompt's leading whole blocks and
// returns how many there are. It allocates nothing.
func hashBlocks(dst *[maxPrefixBlocks]uint64, model, prompt []byte) int {
	seed := xxhash.Sum64(model)
	var d xxhash.Digest
	n := 0
	for n < maxPrefixBlocks && len(prompt) >= prefixBlockBytes {
		d.ResetWithSeed(seed)
		_, _ = d.Write(prompt[:prefixBlockBytes])
		seed = d.Sum64()
		dst[n] = seed
		n++
		prompt = prompt[prefixBlockBytes:]
	}
	return n
}

// affinityBound is the most requests a replica may hold, counting the one being placed, and
// still attract it by prefix affinity: max(f × m, m + 2), where m = (total in-flight + 1) /
// replicas is the mean after placing it and f is the prefix load factor.
//
// The f × m term keeps a shared system prompt from piling onto the replicas that cached it:
// past 1.5 × the mean (by default) the request goes by load instead, and the replica it lands
// on becomes another holder of the prefix. The m + 2 term matters when the service is nearly
// idle, where f × m is below one request and a cache hit is worth queueing behind a request or
// two. The least loaded replica always stays within the bound, since it holds at most m - 1/n.
func affinityBound(replicas []*Replica, factor float64) float64 {
	var total int64
	for _, r := range replicas {
		total += r.InFlight.Load()
	}
	mean := float64(total+1) / float64(len(replicas))
	return max(factor*mean, mean+2)
}

// prefixAffinity sends a request to the replica that was sent the longest prefix of its prompt,
// so the replica's prefix cache skips that part of the prefill, unless that replica is over the
// load bound (affinityBound); among equal matches, including no match at all, the least loaded
// replica wins, ties broken at random. After choosing, it records the prompt's blocks as held
// by the chosen replica.
type prefixAffinity struct {
	index  *prefixIndex
	factor float64
	rand   func() uint64
}

func newPrefixAffinity(opts Options) (*prefixAffinity, error) {
	index, err := newPrefixIndex(opts.PrefixCacheBlocks)
	if err != nil {
		return nil, err
	}
	return &prefixAffinity{index: index, factor: opts.PrefixLoadFactor, rand: opts.Rand}, nil
}

// Needs reports that the picker reads the prompt and model.
func (*prefixAffinity) Needs() Needs { return NeedsPrompt }

func (p *prefixAffinity) Pick(req *Request, replicas []*Replica) *Replica {
	if len(replicas) == 0 {
		return nil
	}
	var m prefixMatch
	p.index.lookup(&m, req.Model, req.Prompt)
	bound := affinityBound(replicas, p.factor)

	var best *Replica
	var bestDepth int
	var bestLoad int64
	ties := uint64(0)
	for _, r := range replicas {
		load := r.InFlight.Load()
		depth := 0
		if float64(load+1) <= bound {
			depth = m.depthOf(r)
		}
		switch {
		case best == nil || depth > bestDepth || (depth == bestDepth && load < bestLoad):
			best, bestDepth, bestLoad, ties = r, depth, load, 1
		case depth == bestDepth && load == bestLoad:
			ties++
			if p.rand()%ties == 0 {
				best = r
			}
		}
	}
	p.index.record(&m, best)
	return best
}
