package replicasim

import (
	"encoding/binary"
	"slices"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/ferryserve/ferry/policy/blocklru"
)

const (
	// blockTokens is vLLM's KV block size.
	blockTokens = 16
	// charsPerToken is the usual estimate of prompt characters per token; the simulator has no
	// tokenizer, and gateways that approximate prefix affinity use the same ratio.
	charsPerToken = 4
	// blockChars is how many prompt bytes make one block under that estimate.
	blockChars = blockTokens * charsPerToken
)

// blockHashes appends to dst the chained hash of every whole 64-byte block of prompt. Each hash
// covers the previous one, so a block matches only when the whole prefix before it matches, and
// the chain is seeded by the model name because different models never share KV blocks. This is
// the scheme of llm-d's approximate prefix scorer (xxhash64, chained, seeded by model).
func blockHashes(dst []uint64, modelSeed uint64, prompt []byte) []uint64 {
	var prev [8]byte
	binary.LittleEndian.PutUint64(prev[:], modelSeed)
	var d xxhash.Digest
	for len(prompt) >= blockChars {
		d.Reset()
		_, _ = d.Write(prev[:])
		_, _ = d.Write(prompt[:blockChars])
		h := d.Sum64()
		dst = append(dst, h)
		binary.LittleEndian.PutUint64(prev[:], h)
		prompt = prompt[blockChars:]
	}
	return dst
}

// prefixCache is an LRU set of block hashes (policy/blocklru): the blocks whose KV the replica
// still holds. A hit or insert allocates nothing once the cache is warm.
//
// Recency follows vLLM's free-block queue: a finished request's blocks are freed last block
// first, so a prompt's leading blocks are evicted after its trailing ones and a cached chain
// shrinks from its end rather than losing its head (which would make the rest unreachable,
// since a match stops at the first missing block). Blocks that running sequences hold for the
// tokens they generate are not free for the cache either: insert evicts down to the capacity
// minus those (KV pressure).
type prefixCache struct {
	mu       sync.Mutex
	capacity int
	set      *blocklru.Set

	// events, when set, is told every insert's net effect on the cache, under mu so that
	// batches go out in the order the cache changed (kvPublisher.publish).
	events func(*kvBatch)
	// The rest is insert's bookkeeping for events. slots[slot] is the hash in that blocklru
	// slot, which Evict does not return, and the insert that stored it; wasNew and evicted
	// are per-insert scratch.
	slots   []slotInfo
	inserts uint64
	wasNew  []bool
	evicted []uint64
}

type slotInfo struct {
	hash   uint64
	insert uint64
}

func newPrefixCache(capacity int, events func(*kvBatch)) *prefixCache {
	return &prefixCache{capacity: capacity, set: blocklru.New(min(capacity, 1<<16)), events: events}
}

// match returns how many leading blocks of hashes are cached, at most limit, and marks them
// recently used, the first most recently, so that a hot shared prefix survives eviction.
func (c *prefixCache) match(hashes []uint64, limit int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, h := range hashes[:min(limit, len(hashes))] {
		if !c.set.Contains(h) {
			break
		}
		n++
	}
	for i := n - 1; i >= 0; i-- {
		slot, _ := c.set.Slot(hashes[i])
		c.set.Touch(slot)
	}
	return n
}

// insert records that the replica now holds the KV of every block in hashes, touching them
// last block first (see prefixCache), and evicts the least recently used blocks beyond the
// capacity less reserved, the blocks running sequences hold outside the cache. At least the
// prompt's own blocks stay, as vLLM cannot run a sequence without them. prompt is the rendered
// prompt the hashes cover, whose bytes are the stored blocks' tokens in events.
func (c *prefixCache) insert(hashes []uint64, prompt []byte, reserved int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	record := c.events != nil
	if record {
		c.beginRecord(hashes)
	}
	limit := max(c.capacity-reserved, min(len(hashes), c.capacity), 1)
	for i := len(hashes) - 1; i >= 0; i-- {
		h := hashes[i]
		if slot, ok := c.set.Slot(h); ok {
			c.set.Touch(slot)
			continue
		}
		for c.set.Len() >= limit {
			slot := c.set.Evict()
			if record && c.slots[slot].insert != c.inserts {
				c.evicted = append(c.evicted, c.slots[slot].hash)
			}
		}
		slot := c.set.Insert(h)
		if record {
			if int(slot) >= len(c.slots) {
				c.slots = append(c.slots, make([]slotInfo, int(slot)+1-len(c.slots))...)
			}
			c.slots[slot] = slotInfo{hash: h, insert: c.inserts}
		}
	}
	if record {
		if b := c.recorded(hashes, prompt); b != nil {
			c.events(b)
		}
	}
}

// beginRecord notes which of hashes the cache lacks before an insert.
func (c *prefixCache) beginRecord(hashes []uint64) {
	c.inserts++
	c.evicted = c.evicted[:0]
	c.wasNew = c.wasNew[:0]
	for _, h := range hashes {
		c.wasNew = append(c.wasNew, !c.set.Contains(h))
	}
}

// recorded is the net effect of the insert just done, nil if none: BlockRemoved for the blocks
// it evicted that the cache held before (a block it stored and then evicted again, which only
// a prompt longer than the cache causes, never existed for a subscriber), and BlockStored for
// each run of consecutive blocks it stored that are still held, with the block before the run
// as parent. A block evicted and stored again within the insert is left out of both.
func (c *prefixCache) recorded(hashes []uint64, prompt []byte) *kvBatch {
	var b kvBatch
	for _, h := range c.evicted {
		if !c.set.Contains(h) {
			b.removed = append(b.removed, h)
		}
	}
	stored := func(i int) bool { return c.wasNew[i] && c.set.Contains(hashes[i]) }
	for i := 0; i < len(hashes); {
		if !stored(i) {
			i++
			continue
		}
		j := i + 1
		for j < len(hashes) && stored(j) {
			j++
		}
		r := storedRun{hashes: slices.Clone(hashes[i:j]), prompt: slices.Clone(prompt[i*blockChars : j*blockChars])}
		if i > 0 {
			r.parent, r.hasParent = hashes[i-1], true
		}
		b.stored = append(b.stored, r)
		i = j
	}
	if len(b.removed) == 0 && len(b.stored) == 0 {
		return nil
	}
	b.ts = time.Now()
	return &b
}

// reset drops every cached block, as vLLM's reset_prefix_cache does, and tells subscribers
// with AllBlocksCleared.
func (c *prefixCache) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.set = blocklru.New(min(c.capacity, 1<<16))
	clear(c.slots)
	if c.events != nil {
		c.events(&kvBatch{ts: time.Now(), cleared: true})
	}
}

// len is the number of cached blocks.
func (c *prefixCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.set.Len()
}
