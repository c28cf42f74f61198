package replicasim

import (
	"encoding/binary"
	"sync"

	"github.com/cespare/xxhash/v2"
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

// prefixCache is an LRU set of block hashes: the blocks whose KV the replica still holds. The
// list is intrusive over a slice so a hit or insert allocates nothing once the cache is warm.
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
	index    map[uint64]int32 // block hash → slot in entries
	entries  []lruEntry
	head     int32 // most recently used, -1 when empty
	tail     int32 // least recently used, -1 when empty
	free     int32 // first entry not in use, chained by next; valid while len(index) < len(entries)
}

type lruEntry struct {
	hash       uint64
	prev, next int32
}

func newPrefixCache(capacity int) *prefixCache {
	return &prefixCache{
		capacity: capacity,
		index:    make(map[uint64]int32, min(capacity, 1<<16)),
		head:     -1,
		tail:     -1,
		free:     -1,
	}
}

// match returns how many leading blocks of hashes are cached, at most limit, and marks them
// recently used, the first most recently, so that a hot shared prefix survives eviction.
func (c *prefixCache) match(hashes []uint64, limit int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, h := range hashes[:min(limit, len(hashes))] {
		if _, ok := c.index[h]; !ok {
			break
		}
		n++
	}
	for i := n - 1; i >= 0; i-- {
		c.moveToFront(c.index[hashes[i]])
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
		if slot, ok := c.index[h]; ok {
			c.moveToFront(slot)
			continue
		}
		for len(c.index) >= limit {
			c.evictOldest()
		}
		var slot int32
		if n := len(c.index); n < len(c.entries) {
			slot = c.free
			c.free = c.entries[slot].next
		} else {
			slot = int32(len(c.entries))
			c.entries = append(c.entries, lruEntry{})
		}
		c.entries[slot].hash = h
		c.index[h] = slot
		c.pushFront(slot)
	}
}

// evictOldest drops the least recently used block and puts its slot on the free list.
func (c *prefixCache) evictOldest() {
	slot := c.tail
	c.unlink(slot)
	delete(c.index, c.entries[slot].hash)
	c.entries[slot].next = c.free
	c.free = slot
}

// len is the number of cached blocks.
func (c *prefixCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.index)
}

func (c *prefixCache) moveToFront(slot int32) {
	if c.head == slot {
		return
	}
	c.unlink(slot)
	c.pushFront(slot)
}

func (c *prefixCache) unlink(slot int32) {
	e := &c.entries[slot]
	if e.prev >= 0 {
		c.entries[e.prev].next = e.next
	} else {
		c.head = e.next
	}
	if e.next >= 0 {
		c.entries[e.next].prev = e.prev
	} else {
		c.tail = e.prev
	}
	e.prev, e.next = -1, -1
}

func (c *prefixCache) pushFront(slot int32) {
	e := &c.entries[slot]
	e.prev, e.next = -1, c.head
	if c.head >= 0 {
		c.entries[c.head].prev = slot
	}
	c.head = slot
	if c.tail < 0 {
		c.tail = slot
	}
}
