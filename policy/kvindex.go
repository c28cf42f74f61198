package policy

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"unsafe"
)

// An engine's KV cache as the engine itself reports it. vLLM publishes an event whenever blocks
// enter its prefix cache (BlockStored: the blocks' hashes, their parent's, their token ids) or
// leave it (BlockRemoved, AllBlocksCleared); the proxy decodes them (proxy/kvevents) into the
// KVBlocks of the replica that sent them. Matching a prompt against them needs its token ids
// (the engine's /tokenize), and the engine's block hashes cannot be recomputed here (vLLM's
// default is SHA-256 over pickled Python tuples, seeded at random per process), so KVBlocks
// names every block by its own chain hash over token ids, as promptBlocks does over bytes, and
// keeps the engine's hash only to find the block again when it is removed.
const (
	// maxKVBlocks bounds one engine's index: 1<<21 blocks (32M tokens at vLLM's 16 per block,
	// beyond any single engine's cache). An index past it has missed removals (dropped events),
	// and starts afresh.
	maxKVBlocks = 1 << 21
	// maxTokenBlocks bounds the work per request: the first 8,192 blocks (128k tokens at 16).
	maxTokenBlocks = 8192
	// claimNanos is how long a pick's claim on the blocks it sent counts before the engine's
	// own event confirms them. vLLM reports a block when the request that fills it is
	// scheduled, which a queued request may not be for seconds; without the claim, the
	// requests of a burst sharing a new prefix would scatter before the first one's blocks
	// are reported.
	claimNanos = 10e9
	// maxBlockSize is the largest block size believed: vLLM's are 1 to 256 tokens.
	maxBlockSize = 1 << 16
	// maxClaims bounds the claims a replica's index keeps; past it, expired claims are swept.
	maxClaims = 1 << 14
)

// KVBlocks is one engine's prefix cache, from its events. It is safe for concurrent use: one
// goroutine applies events while pickers read. The zero value is not usable; see NewKVBlocks.
type KVBlocks struct {
	mu        sync.RWMutex
	blockSize int
	// engine maps the engine's hash of a block to the index's own chain hash of it.
	engine map[uint64]uint64
	// held counts, per chain hash, the engine blocks carrying it (two engine blocks may, when
	// keys the index leaves out differ, such as a cache salt).
	held map[uint64]int32
	// claims are blocks a pick sent and no event has confirmed yet, with the unix nanosecond
	// until which each counts.
	claims map[uint64]int64

	live atomic.Bool
	// orphans counts stored blocks whose parent the index did not know (events it missed, or
	// published before the proxy listened): they cannot be chained, so they are left out.
	orphans atomic.Int64
}

// NewKVBlocks returns an empty index that has heard no event yet.
func NewKVBlocks() *KVBlocks {
	return &KVBlocks{engine: map[uint64]uint64{}, held: map[uint64]int32{}, claims: map[uint64]int64{}}
}

// Live reports whether the engine has reported anything: before that, an empty index means
// only that its events have not started, and pickers keep guessing from bytes.
func (k *KVBlocks) Live() bool { return k.live.Load() }

// BlockSize is the engine's block size in tokens, as its events report it; 0 before any.
func (k *KVBlocks) BlockSize() int {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.blockSize
}

// Len returns how many blocks the engine holds, per its events, and how many claims wait.
func (k *KVBlocks) Len() (held, claims int) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return len(k.engine), len(k.claims)
}

// Orphans returns how many stored blocks were left out for want of their parent.
func (k *KVBlocks) Orphans() int64 { return k.orphans.Load() }

// Stored applies a BlockStored event: hashes are the engine's hashes of consecutive blocks of
// one chain, tokens their token ids (blockSize each), parent the engine's hash of the block
// before the first (hasParent false for a chain's first block). A block size that changes
// means a different engine behind the address: the index starts afresh.
func (k *KVBlocks) Stored(parent uint64, hasParent bool, hashes []uint64, tokens []uint32, blockSize int) {
	if blockSize <= 0 || blockSize > maxBlockSize || len(hashes) == 0 {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.live.Store(true)
	if blockSize != k.blockSize {
		k.reset()
		k.blockSize = blockSize
	}
	var prev uint64
	if hasParent {
		var ok bool
		if prev, ok = k.engine[parent]; !ok {
			k.orphans.Add(int64(len(hashes)))
			return
		}
	}
	if len(k.engine)+len(hashes) > maxKVBlocks {
		k.reset()
		k.blockSize = blockSize
		if hasParent {
			k.orphans.Add(int64(len(hashes)))
			return
		}
	}
	for i, eh := range hashes {
		block := tokens[min(i*blockSize, len(tokens)):min((i+1)*blockSize, len(tokens))]
		if len(block) < blockSize {
			return // a malformed event: fewer token ids than blocks
		}
		h := chainTokens(prev, block)
		if old, ok := k.engine[eh]; ok {
			if old == h {
				prev = h
				continue
			}
			k.release(old)
		}
		k.engine[eh] = h
		k.held[h]++
		delete(k.claims, h)
		prev = h
	}
}

// Removed applies a BlockRemoved event.
func (k *KVBlocks) Removed(hashes []uint64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.live.Store(true)
	for _, eh := range hashes {
		if h, ok := k.engine[eh]; ok {
			delete(k.engine, eh)
			k.release(h)
		}
	}
}

// Cleared applies AllBlocksCleared, and is what a restarted engine's publisher means too.
func (k *KVBlocks) Cleared() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.live.Store(true)
	k.reset()
}

func (k *KVBlocks) release(h uint64) {
	if n := k.held[h] - 1; n > 0 {
		k.held[h] = n
	} else {
		delete(k.held, h)
	}
}

// reset empties the index. Called with k.mu held.
func (k *KVBlocks) reset() {
	clear(k.engine)
	clear(k.held)
	clear(k.claims)
}

// depth returns how many leading blocks of chain the engine holds or a pick claimed less than
// claimNanos ago. Like replicaCache it binary-searches, relying on what an engine holds of a
// chain being a prefix of it: vLLM frees a finished request's blocks last block first, so its
// LRU eviction shortens a cached chain from its end.
func (k *KVBlocks) depth(chain []uint64, now int64) int {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.depthLocked(chain, now)
}

// depthLocked is depth with k.mu held.
func (k *KVBlocks) depthLocked(chain []uint64, now int64) int {
	lo, hi := 0, len(chain)
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if k.holds(chain[mid-1], now) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

func (k *KVBlocks) holds(h uint64, now int64) bool {
	if k.held[h] > 0 {
		return true
	}
	until, ok := k.claims[h]
	return ok && until > now
}

// claim notes that a pick sent the blocks of chain to this engine: until its events confirm
// them, they count as held for claimNanos.
func (k *KVBlocks) claim(chain []uint64, now int64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	// What the engine holds, or a claim still counts, is a prefix (depth): only the rest is new.
	chain = chain[k.depthLocked(chain, now):]
	if len(k.claims)+len(chain) > maxClaims {
		for h, until := range k.claims {
			if until <= now {
				delete(k.claims, h)
			}
		}
	}
	for _, h := range chain {
		if k.held[h] > 0 || len(k.claims) >= maxClaims {
			continue
		}
		k.claims[h] = now + claimNanos
	}
}

// chainTokens names a block of token ids by its content and its parent's name, so that equal
// names mean equal prefixes (promptBlocks' scheme, over token ids instead of bytes). The root's
// parent is 0. The ids are hashed as this machine lays them out in memory, by the runtime's
// AES-based hash (2 µs for a 4k-token prompt's 256 blocks here, where a wyhash-style multiply
// chain over pairs of ids took 3.4–5 µs): the names never leave the process.
func chainTokens(parent uint64, block []uint32) uint64 {
	b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(block))), len(block)*4)
	return maphash.Bytes(hashSeed, b) ^ fmix64(parent)
}

// tokenChain appends to dst the chain hash of every whole blockSize block of tokens, at most
// maxTokenBlocks.
func tokenChain(dst []uint64, tokens []uint32, blockSize int) []uint64 {
	var h uint64
	for n := 0; n < maxTokenBlocks && len(tokens) >= blockSize; n++ {
		h = chainTokens(h, tokens[:blockSize])
		dst = append(dst, h)
		tokens = tokens[blockSize:]
	}
	return dst
}

// SetKV attaches the index of the engine behind r, which a picker that reads prompts consults
// when the request carries its token ids (Request.Tokens). The proxy sets it when it listens
// for the engines' events; nil detaches.
func (r *Replica) SetKV(k *KVBlocks) { r.kv.Store(k) }

// KV returns the index SetKV attached, or nil.
func (r *Replica) KV() *KVBlocks { return r.kv.Load() }
