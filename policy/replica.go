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

	// Later signals (queue depth, KV-cache use, prefix affinity scrapes) go here as atomics.
}

// Preparer is an optional capability of a Picker: it resolves per-replica constants once per
// snapshot, before the snapshot is published, instead of once per request. The proxy calls it
// whenever it builds a snapshot; a picker still works without it (it resolves lazily).
type Preparer interface {
	Prepare(replicas []*Replica)
}

func (r *Replica) loadCapacity() float64 { return math.Float64frombits(r.capacity.Load()) }

func (r *Replica) storeCapacity(v float64) { r.capacity.Store(math.Float64bits(v)) }

// noCopy makes go vet report copies of the struct that embeds it (the same trick as sync.noCopy
// and fasthttp's nocopy.go).
type noCopy struct{}

func (*noCopy) Lock()   {}
func (*noCopy) Unlock() {}
