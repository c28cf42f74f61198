package policy

import (
	"hash/maphash"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func cacheBlock(c byte) string { return strings.Repeat(string(c), cacheBlockBytes) }

func promptHashes(model, prompt string) []uint64 {
	var b promptBlocks
	b.hash([]byte(model), []byte(prompt))
	return append([]uint64(nil), b.hashes[:b.n]...)
}

func TestPromptBlocksChainHashing(t *testing.T) {
	tests := map[string]struct {
		model, prompt string
		wantBlocks    int
		wantTokens    int
		// wantSame lists, per block, whether it equals the same block of ref (same model).
		refModel, ref string
		wantSame      []bool
	}{
		"empty":                 {prompt: "", wantBlocks: 0, wantTokens: 0},
		"shorter than a block":  {prompt: cacheBlock('a')[1:], wantBlocks: 0, wantTokens: cacheBlockTokens},
		"partial block ignored": {prompt: cacheBlock('a') + cacheBlock('b') + "tail", wantBlocks: 2, wantTokens: 2*cacheBlockTokens + 1},
		"bounded": {prompt: strings.Repeat("x", (maxPromptBlocks+5)*cacheBlockBytes), wantBlocks: maxPromptBlocks,
			wantTokens: (maxPromptBlocks + 5) * cacheBlockTokens},
		"shared prefix": {
			model: "m", prompt: cacheBlock('a') + cacheBlock('b') + cacheBlock('c'),
			refModel: "m", ref: cacheBlock('a') + cacheBlock('b') + cacheBlock('d'),
			wantBlocks: 3, wantTokens: 3 * cacheBlockTokens, wantSame: []bool{true, true, false},
		},
		// Block 1 is the same text after a different block 0: its hash covers block 0 too.
		"chained": {
			model: "m", prompt: cacheBlock('a') + cacheBlock('b'),
			refModel: "m", ref: cacheBlock('z') + cacheBlock('b'),
			wantBlocks: 2, wantTokens: 2 * cacheBlockTokens, wantSame: []bool{false, false},
		},
		// After a divergence, equal text never matches again.
		"no resync": {
			model: "m", prompt: cacheBlock('a') + cacheBlock('b') + cacheBlock('c'),
			refModel: "m", ref: cacheBlock('a') + cacheBlock('x') + cacheBlock('c'),
			wantBlocks: 3, wantTokens: 3 * cacheBlockTokens, wantSame: []bool{true, false, false},
		},
		"model seeds the chain": {
			model: "llama", prompt: cacheBlock('a'),
			refModel: "mistral", ref: cacheBlock('a'),
			wantBlocks: 1, wantTokens: cacheBlockTokens, wantSame: []bool{false},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var b promptBlocks
			b.hash([]byte(tc.model), []byte(tc.prompt))
			if b.n != tc.wantBlocks || b.tokens != tc.wantTokens {
				t.Fatalf("%d blocks, %d tokens; want %d and %d", b.n, b.tokens, tc.wantBlocks, tc.wantTokens)
			}
			if tc.wantSame == nil {
				return
			}
			got, ref := promptHashes(tc.model, tc.prompt), promptHashes(tc.refModel, tc.ref)
			same := make([]bool, len(got))
			for i := range got {
				same[i] = got[i] == ref[i]
			}
			if diff := cmp.Diff(tc.wantSame, same); diff != "" {
				t.Errorf("blocks equal to the reference's (-want +got):\n%s", diff)
			}
		})
	}
}

// TestPromptBlocksEveryByteCounts changes each byte of a two-block prompt in turn: the block
// holding it, and the one after, must hash differently (hashing samples nothing).
func TestPromptBlocksEveryByteCounts(t *testing.T) {
	prompt := []byte(cacheBlock('a') + cacheBlock('b'))
	ref := promptHashes("m", string(prompt))
	for i := range prompt {
		changed := slices.Clone(prompt)
		changed[i] ^= 1
		got := promptHashes("m", string(changed))
		for block := i / cacheBlockBytes; block < len(got); block++ {
			if got[block] == ref[block] {
				t.Fatalf("changing byte %d left block %d's hash unchanged", i, block)
			}
		}
	}
}

func TestReplicaCacheDepth(t *testing.T) {
	conv := promptHashes("m", cacheBlock('s')+cacheBlock('a')+cacheBlock('b')+cacheBlock('c'))
	other := promptHashes("m", cacheBlock('s')+cacheBlock('x'))
	c := newReplicaCache(100)
	if got := c.depth(conv); got != 0 {
		t.Errorf("empty cache: depth %d, want 0", got)
	}
	c.record(conv[:2])
	tests := map[string]struct {
		hashes []uint64
		want   int
	}{
		"longer prompt, recorded prefix": {conv, 2},
		"exactly recorded":               {conv[:2], 2},
		"shares the first block":         {other, 1},
		"nothing":                        {promptHashes("m", cacheBlock('q')), 0},
		"other model":                    {promptHashes("n", cacheBlock('s')+cacheBlock('a')), 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := c.depth(tc.hashes); got != tc.want {
				t.Errorf("depth %d, want %d", got, tc.want)
			}
		})
	}
}

// Eviction takes a prompt's trailing blocks before its leading ones, as vLLM's free-block queue
// does, so what a replica holds of a chain stays a prefix of it (which depth's binary search
// relies on) and the least recently used conversation goes first.
func TestReplicaCacheEvictsLeastRecentTailsFirst(t *testing.T) {
	a := promptHashes("m", cacheBlock('a')+cacheBlock('b')+cacheBlock('c')+cacheBlock('d'))
	b := promptHashes("m", cacheBlock('x')+cacheBlock('y'))
	c := newReplicaCache(5)
	c.record(a)
	c.record(b) // one over: a's last block goes
	if got := c.depth(a); got != 3 {
		t.Errorf("a after one eviction: depth %d, want 3", got)
	}
	c.record(a[:3]) // a's blocks are the most recent now; b's the oldest
	c.record(promptHashes("m", cacheBlock('z')+cacheBlock('w')))
	if got := c.depth(b); got != 0 {
		t.Errorf("b, the least recently used: depth %d, want 0", got)
	}
	if got := c.depth(a); got != 3 {
		t.Errorf("a, recently used: depth %d, want 3", got)
	}
	if held, limit := c.size(); held != 5 || limit != 5 {
		t.Errorf("held %d of %d, want 5 of 5", held, limit)
	}
	c.setLimit(2) // takes effect at the next record: a's blocks are the oldest now
	c.record(a[:1])
	if held, _ := c.size(); held != 2 {
		t.Errorf("after shrinking to 2: held %d", held)
	}
	if got := c.depth(a); got != 1 {
		t.Errorf("a after shrinking: depth %d, want 1 (its head, just recorded again)", got)
	}
}

// A prompt longer than the whole cache keeps its leading blocks, not its trailing ones.
func TestReplicaCacheLongPromptKeepsItsHead(t *testing.T) {
	long := promptHashes("m", strings.Repeat("abcdefgh", 40*cacheBlockBytes/8))
	c := newReplicaCache(16)
	c.record(long)
	if got := c.depth(long); got != 16 {
		t.Errorf("depth %d, want the first 16 blocks", got)
	}
}

// BenchmarkReplicaCacheMemory reports the heap one replica's index takes when full, per block
// and at maxCacheBlocks (the figure replicaCache's comment and docs/serving.md's least_ttft
// paragraph quote).
func BenchmarkReplicaCacheMemory(b *testing.B) {
	var before, after runtime.MemStats
	var keep *replicaCache
	for b.Loop() {
		runtime.GC()
		runtime.ReadMemStats(&before)
		c := newReplicaCache(maxCacheBlocks)
		hashes := make([]uint64, 256)
		for i := 0; i < maxCacheBlocks; i += len(hashes) {
			for j := range hashes {
				hashes[j] = fmix64(uint64(i + j + 1))
			}
			c.record(hashes)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		keep = c
	}
	if held, _ := keep.size(); held != maxCacheBlocks {
		b.Fatalf("held %d blocks, want %d", held, maxCacheBlocks)
	}
	bytes := float64(after.HeapAlloc) - float64(before.HeapAlloc)
	b.ReportMetric(bytes/maxCacheBlocks, "B/block")
	b.ReportMetric(bytes/(1<<20), "MiB/replica")
}

// BenchmarkPromptBlocksHash is hashing BenchmarkLeastTTFTPick's 4k-token prompt (16.5 KiB):
// "pick" as promptBlocks.hash does, "maphash.Bytes" the same chain with maphash.Bytes per
// block, which hashes 128 bytes at a time, each piece seeding the next (the figure
// promptBlocks.hash's comment quotes).
func BenchmarkPromptBlocksHash(b *testing.B) {
	prompt := conversation(0, 2048, 4, 1800)
	model := []byte("m")
	b.Run("pick", func(b *testing.B) {
		var blocks promptBlocks
		b.SetBytes(int64(len(prompt)))
		for b.Loop() {
			blocks.hash(model, prompt)
		}
	})
	b.Run("maphash.Bytes", func(b *testing.B) {
		var blocks promptBlocks
		b.SetBytes(int64(len(prompt)))
		for b.Loop() {
			h, n := maphash.Bytes(hashSeed, model), 0
			for rest := prompt; len(rest) >= cacheBlockBytes; rest = rest[cacheBlockBytes:] {
				h = maphash.Bytes(hashSeed, rest[:cacheBlockBytes]) ^ fmix64(h)
				blocks.hashes[n] = h
				n++
			}
		}
	})
}

// The index behaves as a plain LRU list whatever the chains, limits and evictions: record's
// shortcut through parent slots never changes what is held or in which order.
func TestReplicaCacheMatchesAPlainLRU(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	c := newReplicaCache(40)
	var model []uint64 // most recent first
	conversations := make([][]uint64, 12)
	for step := range 3000 {
		if step%500 == 499 {
			c.setLimit(8 + rng.IntN(60)) // applied at the next record, by both
		}
		k := rng.IntN(len(conversations))
		switch rng.IntN(4) {
		case 0: // a new conversation, sharing a prefix with another sometimes
			n := 1 + rng.IntN(6)
			var chain []uint64
			if o := conversations[rng.IntN(len(conversations))]; len(o) > 0 && rng.IntN(2) == 0 {
				chain = append(chain, o[:1+rng.IntN(len(o))]...)
			}
			for range n {
				chain = append(chain, rng.Uint64()|1)
			}
			conversations[k] = chain
		default: // the next turn of one
			for range 1 + rng.IntN(3) {
				conversations[k] = append(conversations[k], rng.Uint64()|1)
			}
		}
		chain := conversations[k]
		c.record(chain)
		_, limit := c.size()
		for len(model) > limit {
			model = model[:len(model)-1]
		}
		for i := len(chain) - 1; i >= 0; i-- {
			model = slices.DeleteFunc(model, func(h uint64) bool { return h == chain[i] })
			model = append([]uint64{chain[i]}, model...)
			if len(model) > limit {
				model = model[:limit]
			}
		}
		var got []uint64
		c.set.Each(func(h uint64) { got = append(got, h) })
		if !slices.Equal(got, model) {
			t.Fatalf("step %d: index order differs from a plain LRU:\n got  %x\n want %x", step, got, model)
		}
	}
}

// TestReplicaCacheRunBeforeInsert records a chain whose tail is cached at the list's end but
// whose head is not (possible only when the tail was recorded under another head: a hash
// collision, or a test): the cached run must move before the new head's insert evicts.
func TestReplicaCacheRunBeforeInsert(t *testing.T) {
	const a, b, c, d, e = 1, 2, 3, 4, 5
	cache := newReplicaCache(4)
	for _, chain := range [][]uint64{{b, c}, {d}, {e}, {a, b, c}} {
		cache.record(chain)
	}
	var got []uint64
	cache.set.Each(func(h uint64) { got = append(got, h) })
	if diff := cmp.Diff([]uint64{a, b, c, e}, got); diff != "" {
		t.Errorf("index, most recent first (-want +got):\n%s", diff)
	}
}
