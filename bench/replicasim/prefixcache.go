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
type prefixCache struct {
	mu       sync.Mutex
	capacity int
	index    map[uint64]int32 // block hash → slot in entries
	entries  []lruEntry
	head     int32 // most recently used, -1 when empty
	tail     int32 // least recently used, -1 when empty
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
	}
}

// match returns how many leading blocks of hashes are cached, at most limit, and marks them
// recently used so that a hot shared prefix survives eviction.
func (c *prefixCache) match(hashes []uint64, limit int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, h := range hashes[:min(limit, len(hashes))] {
		slot, ok := c.index[h]
		if !ok {
			break
		}
		c.moveToFront(slot)
		n++
	}
	return n
}

// insert records that the replica now holds the KV of every block in hashes, evicting the least
// recently used blocks beyond capacity.
func (c *prefixCache) insert(hashes []uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, h := range hashes {
		if slot, ok := c.index[h]; ok {
			c.moveToFront(slot)
			continue
		}
		var slot int32
		if len(c.entries) < c.capacity {
			slot = int32(len(c.entries))
			c.entries = append(c.entries, lruEntry{})
		} else {
			slot = c.tail
			c.unlink(slot)
			delete(c.index, c.entries[slot].hash)
		}
		c.entries[slot].hash = h
		c.index[h] = slot
		c.pushFront(slot)
	}
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
