package policy

import (
	"hash/maphash"
	"sync"
	"unsafe"

	"github.com/ferryserve/ferry/policy/blocklru"
)

// The per-replica prefix index of least_ttft. Unlike prefix_affinity's index (prefix.go), which
// remembers where prompts were sent in one shared LRU, it keeps one LRU per replica, sized like
// that replica's KV cache, so that what it forgets is roughly what the engine evicts.
const (
	// bytesPerToken is the usual estimate of prompt bytes per token without a tokenizer (llm-d's
	// approximate prefix scorer and AIBrix make the same one).
	bytesPerToken = 4
	// cacheBlockTokens is the index's block: 128 estimated tokens, eight of vLLM's 16-token
	// blocks. Coarser than the engine's so that a 4k-token prompt costs 32 hashes and LRU
	// updates, not 256 (BenchmarkLeastTTFTPick on 4 replicas: 1.0 µs a pick when cached,
	// 4.0 when not; 64-token blocks took 1.35 and 7.5); the price is up to 127 tokens of a
	// cached prefix counted as uncached, a few per cent of the prompts where caching matters.
	cacheBlockTokens = 128
	cacheBlockBytes  = cacheBlockTokens * bytesPerToken
	// maxPromptBlocks bounds the work per request: the first 128k estimated tokens of a prompt
	// are hashed (8 KiB of hashes on the picking goroutine's stack). Longer prompts are rare;
	// their remainder counts as uncached everywhere, which does not change which replica wins.
	maxPromptBlocks = 1024
	// minCacheBlocks and maxCacheBlocks bound one replica's index: at most 1<<16 blocks (8M
	// tokens, more than an 8-GPU node's KV cache for a 70B model), 3.7 MiB (see replicaCache).
	minCacheBlocks = 16
	maxCacheBlocks = 1 << 16
	// DefaultPrefixCacheTokens is the KV cache assumed for a replica that has not announced
	// its own (vllm:cache_config_info) when none is configured: 256k tokens, a 7-8B model on
	// one 80 GB GPU. The replica's hit counters correct it (see ttftReplica.correct).
	DefaultPrefixCacheTokens = 1 << 18
)

// hashSeed seeds every prompt hash in this process. The index is the process's own picture and
// is never compared with an engine's hashes, so a random seed costs nothing and makes crafted
// collisions impractical.
var hashSeed = maphash.MakeSeed()

// promptBlocks is one prompt cut into cacheBlockBytes blocks, each named by a chained hash: the
// hash of block i covers blocks 0..i and the model, as vLLM's block hashes cover their parent,
// so "a replica holds block i" means it holds the whole prefix up to there and different models
// never share a block. Only whole blocks count, as in vLLM. It lives on the picking goroutine's
// stack, so hashing allocates nothing.
type promptBlocks struct {
	n      int // whole blocks hashed
	tokens int // estimated tokens of the whole prompt
	hashes [maxPromptBlocks]uint64
}

// hash fills b from the prompt as the proxy received it: the raw JSON of "messages" (every
// message in order, roles included, as the engine's chat template renders them) or "prompt".
// It costs one pass over the prompt with the runtime's AES hash, one call per block: a block
// is viewed as a string (no copy; it is not kept) for maphash.Comparable, which hashes it
// whole as a map hashes a key. maphash.Bytes hashes 128 bytes at a time, each piece seeding
// the next, and a [cacheBlockBytes]byte value is copied twice on the way: for a 16.5 KiB
// prompt they took 1.5 and 0.85 µs here, this 0.55 (BenchmarkPromptBlocksHash).
func (b *promptBlocks) hash(model, prompt []byte) {
	b.tokens = (len(prompt) + bytesPerToken - 1) / bytesPerToken
	h := maphash.Bytes(hashSeed, model)
	n := 0
	for n < maxPromptBlocks && len(prompt) >= cacheBlockBytes {
		h = maphash.Comparable(hashSeed, unsafe.String(&prompt[0], cacheBlockBytes)) ^ fmix64(h)
		b.hashes[n] = h
		n++
		prompt = prompt[cacheBlockBytes:]
	}
	b.n = n
}

// replicaCache approximates which prompt blocks one replica's KV cache holds: an LRU set of
// block hashes bounded by the replica's cache size (ttftReplica sets the limit from
// vllm:cache_config_info or configuration, corrected by the replica's hit counters).
//
// Recency follows vLLM's: a request's blocks are touched last block first, so a prompt's leading
// blocks are always more recent than its trailing ones, eviction shortens a cached chain from
// its end, and the blocks a replica holds of any prompt are a prefix of it. depth relies on that
// to binary-search instead of walking every block.
//
// Memory: a map entry (8-byte key, 4-byte slot, in Go's swiss tables at their load factor) and
// a 16-byte list entry (policy/blocklru) and a 4-byte parent per block: 59 bytes a block
// measured when full (BenchmarkReplicaCacheMemory), 3.7 MiB at maxCacheBlocks, about 120 KiB for a replica
// announcing 16k vLLM blocks of 16 tokens (2,048 index blocks). The list never grows beyond the
// largest limit set.
type replicaCache struct {
	mu    sync.Mutex
	limit int
	set   *blocklru.Set
	// parents[slot] is the slot of the block before slot's in its chain when last recorded;
	// -1 if none. Kept beside the set's slots, which are stable while a block is held.
	parents []int32
}

func newReplicaCache(limit int) *replicaCache {
	return &replicaCache{limit: limit, set: blocklru.New(0)}
}

// depth returns how many leading blocks of hashes the replica holds, assuming (see
// replicaCache) that what it holds of a chain is a prefix of it: O(log n) lookups.
func (c *replicaCache) depth(hashes []uint64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	lo, hi := 0, len(hashes) // the answer is in [lo, hi]
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if c.set.Contains(hashes[mid-1]) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// record notes that the replica was sent a prompt with these blocks: they become its most
// recently used, the first block most recent, and the least recently used beyond the limit go.
//
// Each entry remembers the slot of the block before it in its chain (parent), so walking a
// cached chain from its deepest block costs one map lookup, not one per block: a parent slot
// is trusted only while it still holds the expected hash, else the map decides. Blocks already
// in chain order in the list (a conversation's earlier turn, recorded whole) move to the front
// as one run (blocklru.Set.TouchRun), the same order as touching each, last first.
func (c *replicaCache) record(hashes []uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.set.Len() > c.limit {
		c.evictOldest()
	}
	// runFirst..runLast are the blocks after block i, in chain order in the list and not yet
	// moved; -1 when none.
	runFirst, runLast := int32(-1), int32(-1)
	child := int32(-1) // the slot of block i+1, whose parent is block i
	for i := len(hashes) - 1; i >= 0; i-- {
		h := hashes[i]
		slot := int32(-1)
		if child >= 0 {
			if p := c.parents[child]; p >= 0 && c.set.Hash(p) == h && h != 0 {
				slot = p
			}
		}
		if slot < 0 {
			if s, ok := c.set.Slot(h); ok {
				slot = s
			}
		}
		switch {
		case slot >= 0 && runFirst >= 0 && c.set.Next(slot) == runFirst:
			runFirst = slot
		case slot >= 0:
			if runFirst >= 0 {
				c.set.TouchRun(runFirst, runLast)
			}
			runFirst, runLast = slot, slot
		default:
			// The run moves before an insert can evict it.
			if runFirst >= 0 {
				c.set.TouchRun(runFirst, runLast)
			}
			slot = c.insert(h)
			runFirst, runLast = slot, slot
		}
		if child >= 0 {
			c.parents[child] = slot
		}
		child = slot
	}
	if runFirst >= 0 {
		c.set.TouchRun(runFirst, runLast)
	}
}

// insert adds h as the most recently used block, evicting the least recently used at the
// limit, and returns its slot.
func (c *replicaCache) insert(h uint64) int32 {
	if c.set.Len() >= c.limit {
		c.evictOldest()
	}
	slot := c.set.Insert(h)
	if int(slot) == len(c.parents) {
		c.parents = append(c.parents, -1)
	}
	c.parents[slot] = -1
	return slot
}

// setLimit changes the bound; a smaller one takes effect at the next record.
func (c *replicaCache) setLimit(limit int) {
	c.mu.Lock()
	c.limit = limit
	c.mu.Unlock()
}

// size returns the number of blocks held and the limit.
func (c *replicaCache) size() (held, limit int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.set.Len(), c.limit
}

func (c *replicaCache) evictOldest() {
	c.parents[c.set.Evict()] = -1
}
