// Package policy holds Ferry's load-balancing decisions: given an immutable snapshot of READY
// replicas, which one gets this request. Policies are pure over the snapshot and its live
// counters; they do no I/O, so they can be table-tested and benchmarked in isolation and replayed
// from a log when their randomness is seeded.
package policy

import (
	"math"
	"sync/atomic"
)

// Replica is one READY replica as a policy sees it. The proxy builds one per replica when its
// replica set changes and keeps reusing the same pointer while the replica stays, so the live
// counters survive snapshot swaps.
//
// The identity fields (ID, Addr, Accelerator, Version) are set once, before the replica is
// published in a snapshot, and never written again: pickers read them without locks. Live signals
// are atomics. A Replica must not be copied (go vet's copylocks check enforces it through noCopy),
// because a copy would split its counters.
type Replica struct {
	noCopy noCopy

	// ID is the replica's id within its service (SkyServe semantics: never reused).
	ID int
	// Addr is host:port.
	Addr string
	// Accelerator is the replica's accelerator name ("A100", "L4", ...), used by
	// instance_aware_least_load; empty when unknown.
	Accelerator string
	// Version is the service version the replica runs.
	Version int

	// InFlight counts requests forwarded to this replica whose response has not finished
	// streaming. The proxy increments it when a request is sent and decrements it when the
	// response stream ends, so a long SSE stream counts for its whole duration.
	InFlight atomic.Int64

	// capacity caches, as float64 bits, the target QPS a capacity-aware picker resolved for this
	// replica, so that the request path does not look up a map by accelerator name. Zero means
	// not resolved yet. See Preparer.
	capacity atomic.Uint64

	// The replica's own view of its load, as last scraped from its /metrics endpoint (see
	// Metrics). Each is written by one scraper goroutine and read by every picker.
	waiting   atomic.Int64
	running   atomic.Int64
	kvUsage   atomic.Uint64 // float64 bits
	scrapedAt atomic.Int64  // unix nanoseconds; 0 = never scraped
	// The replica's prefix cache as last scraped: its size and its counters, for least_ttft.
	cacheTokens   atomic.Int64
	prefixQueries atomic.Uint64 // float64 bits
	prefixHits    atomic.Uint64 // float64 bits
	// kv is the engine's own report of its prefix cache, when the proxy hears its events.
	kv atomic.Pointer[KVBlocks]
	// adapters is its LoRA adapters' state (adapters.go), made at the first request for one.
	adapters atomic.Pointer[adapterLoads]
}

// Preparer is an optional capability of a Picker: it resolves per-replica constants once per
// snapshot, before the snapshot is published, instead of once per request. The proxy calls it
// whenever it builds a snapshot; a picker still works without it (it resolves lazily).
type Preparer interface {
	Prepare(replicas []*Replica)
}

// Metrics is what a replica last reported about its own load on its Prometheus endpoint. The
// proxy's in-flight count only sees requests it sent; these see what the engine does with them:
// whether they queue (Waiting), how big the decode batch is (Running) and how close the KV cache
// is to full, when new sequences start to wait or be preempted (KVCacheUsage).
type Metrics struct {
	// Waiting is the number of requests queued for a batch slot (vllm:num_requests_waiting,
	// tgi_queue_size).
	Waiting int64
	// Running is the number of requests in the decode batch (vllm:num_requests_running,
	// tgi_batch_current_size).
	Running int64
	// KVCacheUsage is the used share of the KV cache, 0 to 1 (vllm:kv_cache_usage_perc); TGI
	// does not report it and it stays 0.
	KVCacheUsage float64
	// CacheTokens is the KV cache's size in tokens, num_gpu_blocks × block_size of
	// vllm:cache_config_info; 0 when the replica does not say.
	CacheTokens int64
	// PrefixQueries and PrefixHits are the engine's prefix-cache counters, in prompt tokens
	// looked up and found cached since it started (vllm:prefix_cache_queries_total and
	// vllm:prefix_cache_hits_total); both 0 when it does not export them.
	PrefixQueries, PrefixHits float64
	// UpdatedAt is when the values were scraped, in unix nanoseconds; 0 means never. Pickers
	// ignore values older than their staleness limit, so a replica whose endpoint stops
	// answering falls back to being judged on in-flight requests alone.
	UpdatedAt int64
}

// SetMetrics publishes a scrape. The values are stored before the timestamp and LoadMetrics
// reads the timestamp first, so a reader that sees a fresh UpdatedAt also sees values at least
// that fresh; the fields are not one atomic unit, and a reader may see a newer value than its
// timestamp, which does no harm.
func (r *Replica) SetMetrics(m Metrics) {
	r.waiting.Store(m.Waiting)
	r.running.Store(m.Running)
	r.kvUsage.Store(math.Float64bits(m.KVCacheUsage))
	r.cacheTokens.Store(m.CacheTokens)
	r.prefixQueries.Store(math.Float64bits(m.PrefixQueries))
	r.prefixHits.Store(math.Float64bits(m.PrefixHits))
	r.scrapedAt.Store(m.UpdatedAt)
}

// LoadMetrics returns the last published scrape; UpdatedAt is 0 if there was none.
func (r *Replica) LoadMetrics() Metrics {
	var m Metrics
	m.UpdatedAt = r.scrapedAt.Load()
	m.Waiting = r.waiting.Load()
	m.Running = r.running.Load()
	m.KVCacheUsage = math.Float64frombits(r.kvUsage.Load())
	m.CacheTokens = r.cacheTokens.Load()
	m.PrefixQueries = math.Float64frombits(r.prefixQueries.Load())
	m.PrefixHits = math.Float64frombits(r.prefixHits.Load())
	return m
}

func (r *Replica) loadCapacity() float64 { return math.Float64frombits(r.capacity.Load()) }

func (r *Replica) storeCapacity(v float64) { r.capacity.Store(math.Float64bits(v)) }

// noCopy makes go vet report copies of the struct that embeds it (the same trick as sync.noCopy
// and fasthttp's nocopy.go).
type noCopy struct{}

func (*noCopy) Lock()   {}
func (*noCopy) Unlock() {}
