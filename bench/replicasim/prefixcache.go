package replicasim

import (
	"encoding/binary"
	"sync"

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
}

func newPrefixCache(capacity int) *prefixCache {
	return &prefixCache{capacity: capacity, set: blocklru.New(min(capacity, 1<<16))}
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
// prompt's own blocks stay, as vLLM cannot run a sequence without them.
func (c *prefixCache) insert(hashes []uint64, reserved int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	limit := max(c.capacity-reserved, min(len(hashes), c.capacity), 1)
	for i := len(hashes) - 1; i >= 0; i-- {
		h := hashes[i]
		if slot, ok := c.set.Slot(h); ok {
			c.set.Touch(slot)
			continue
		}
		for c.set.Len() >= limit {
			c.set.Evict()
		}
		c.set.Insert(h)
	}
}

// len is the number of cached blocks.
func (c *prefixCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.set.Len()
}
