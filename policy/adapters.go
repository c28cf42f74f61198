package policy

import (
	"slices"
	"sync"
	"sync/atomic"
)

// LoRA adapters. One base model serves many adapters, each named by the request's "model"; an
// engine runs at most max_loras of them at once (vLLM's --max-loras), and a request for another
// waits until a slot is free of other adapters' requests, then pays the adapter's load. So
// routing wants each adapter where it is already active, within the load bound, and a hot
// adapter on more than one replica: least_ttft prices a missing adapter into its TTFT estimate
// (leastttft.go, adapterCost), from what this proxy sent (Replica.AdapterBegin) and what the
// engine reports (vllm:lora_requests_info, Replica.SetLoRA).

// MaxAdapters bounds the adapter names one service tracks: the names come from clients'
// requests only through names the replicas or the operator declared, but a table per replica
// must stay small whatever they declare.
const MaxAdapters = 4096

// DefaultMaxLoRAs is what a replica that reports no max_lora is taken to run: vLLM's default.
const DefaultMaxLoRAs = 1

// maxRecentAdapters bounds the adapters a replica's recency list holds: more than any engine's
// max_loras (vLLM's GPUs run up to a few dozen).
const maxRecentAdapters = 64

// Adapters numbers one service's adapter names. Lookups are lock-free; names are only added,
// up to MaxAdapters. The zero value is not usable: NewAdapters.
type Adapters struct {
	mu    sync.Mutex
	names atomic.Pointer[map[string]int32]
}

// NewAdapters returns an empty table.
func NewAdapters() *Adapters {
	a := &Adapters{}
	m := map[string]int32{}
	a.names.Store(&m)
	return a
}

// Len is how many names the table holds.
func (a *Adapters) Len() int { return len(*a.names.Load()) }

// Lookup returns the number of name plus one, or 0 when it is not an adapter (Request.Adapter's
// convention). It does not allocate.
func (a *Adapters) Lookup(name []byte) int32 {
	if i, ok := (*a.names.Load())[string(name)]; ok {
		return i + 1
	}
	return 0
}

// Add numbers each name not in the table yet, while it has room, and reports whether any was
// new. The table is copied on write: names arrive with replicas and scrapes, not requests.
func (a *Adapters) Add(names ...string) bool {
	cur := *a.names.Load()
	if !slices.ContainsFunc(names, func(n string) bool { _, ok := cur[n]; return !ok && n != "" }) {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	old := *a.names.Load()
	next := make(map[string]int32, len(old)+len(names))
	for k, v := range old {
		next[k] = v
	}
	added := false
	for _, n := range names {
		if _, ok := next[n]; !ok && n != "" && len(next) < MaxAdapters {
			next[n] = int32(len(next))
			added = true
		}
	}
	a.names.Store(&next)
	return added
}

// adapterChunk is 64 adapters' counters on one replica; chunks are made when first used, so a
// replica's table costs memory only for the adapters sent to it.
const adapterChunk = 64

type adapterCounters struct {
	inflight [adapterChunk]atomic.Int32
}

// adapterLoads is a replica's adapter state.
type adapterLoads struct {
	chunks [MaxAdapters / adapterChunk]atomic.Pointer[adapterCounters]
	// active counts the adapters with requests of this proxy in flight.
	active atomic.Int32
	// recent lists adapters by their last request from this proxy, most recent first: an
	// engine evicts the least recently used adapter, so the first max_loras are likely active.
	mu     sync.Mutex
	recent []int32
	// lora is the engine's own report, vllm:lora_requests_info.
	lora atomic.Pointer[LoRAInfo]
}

// LoRAInfo is what an engine reports of its adapters (vllm:lora_requests_info).
type LoRAInfo struct {
	// Running and Waiting are the adapters (Adapters' numbers) of its running and waiting
	// requests.
	Running, Waiting []int32
	// MaxLoRAs is its max_lora; 0 when it did not say.
	MaxLoRAs int
	// UpdatedAt is when it was scraped, in unix nanoseconds.
	UpdatedAt int64
}

func (r *Replica) adapterState() *adapterLoads {
	if s := r.adapters.Load(); s != nil {
		return s
	}
	r.adapters.CompareAndSwap(nil, &adapterLoads{})
	return r.adapters.Load()
}

func (s *adapterLoads) counters(a int32) *adapterCounters {
	slot := &s.chunks[a/adapterChunk]
	if c := slot.Load(); c != nil {
		return c
	}
	slot.CompareAndSwap(nil, &adapterCounters{})
	return slot.Load()
}

// AdapterBegin counts a request for adapter a (Adapters' number, not plus one) sent to r.
func (r *Replica) AdapterBegin(a int32) {
	if a < 0 || a >= MaxAdapters {
		return
	}
	s := r.adapterState()
	if s.counters(a).inflight[a%adapterChunk].Add(1) == 1 {
		s.active.Add(1)
	}
	s.mu.Lock()
	if i := slices.Index(s.recent, a); i >= 0 {
		copy(s.recent[1:i+1], s.recent[:i])
		s.recent[0] = a
	} else {
		if len(s.recent) < maxRecentAdapters {
			s.recent = append(s.recent, 0)
		}
		copy(s.recent[1:], s.recent)
		s.recent[0] = a
	}
	s.mu.Unlock()
}

// AdapterEnd undoes AdapterBegin when the request ends.
func (r *Replica) AdapterEnd(a int32) {
	if a < 0 || a >= MaxAdapters {
		return
	}
	s := r.adapterState()
	if s.counters(a).inflight[a%adapterChunk].Add(-1) == 0 {
		s.active.Add(-1)
	}
}

// AdapterForget drops adapter a from r's recent adapters: the replica does not have it after
// all (loading it failed, or the engine answered 404 for it), so routing must not price it as
// loaded there.
func (r *Replica) AdapterForget(a int32) {
	s := r.adapters.Load()
	if s == nil {
		return
	}
	s.mu.Lock()
	if i := slices.Index(s.recent, a); i >= 0 {
		s.recent = slices.Delete(s.recent, i, i+1)
	}
	s.mu.Unlock()
}

// AdapterInFlight is how many requests for adapter a this proxy has on r.
func (r *Replica) AdapterInFlight(a int32) int32 {
	s := r.adapters.Load()
	if s == nil || a < 0 || a >= MaxAdapters {
		return 0
	}
	if c := s.chunks[a/adapterChunk].Load(); c != nil {
		return c.inflight[a%adapterChunk].Load()
	}
	return 0
}

// SetLoRA publishes a scrape of the engine's adapters.
func (r *Replica) SetLoRA(info LoRAInfo) { r.adapterState().lora.Store(&info) }

// LoRA returns the last published report, if any.
func (r *Replica) LoRA() (LoRAInfo, bool) {
	if s := r.adapters.Load(); s != nil {
		if info := s.lora.Load(); info != nil {
			return *info, true
		}
	}
	return LoRAInfo{}, false
}

// adapterView is what a pick knows of adapter a on r: whether it is likely active there, how
// many adapters are active, and how many can be. staleAfter bounds the age of the engine's
// report; defaultMax stands in for a max_lora the engine did not report.
//
// queued is how many other adapters the engine reports waiting for a slot (each needs one to
// drain before it), and pending whether a itself is among them (its load is under way then).
func (r *Replica) adapterView(a int32, now, staleAfter int64, defaultMax int) (v adapterView) {
	v.maxLoRAs = defaultMax
	s := r.adapters.Load()
	if s == nil {
		return v
	}
	if info := s.lora.Load(); info != nil && now-info.UpdatedAt <= staleAfter {
		if info.MaxLoRAs > 0 {
			v.maxLoRAs = info.MaxLoRAs
		}
		v.active = len(info.Running)
		v.resident = slices.Contains(info.Running, a)
		v.pending = slices.Contains(info.Waiting, a)
		v.queued = len(info.Waiting)
		if v.pending {
			v.queued--
		}
	}
	v.active = max(v.active, int(s.active.Load()))
	if c := s.chunks[a/adapterChunk].Load(); c != nil && c.inflight[a%adapterChunk].Load() > 0 && !v.pending {
		v.resident = true
	}
	s.mu.Lock()
	i := slices.Index(s.recent, a)
	v.held = max(v.active, min(len(s.recent), v.maxLoRAs))
	s.mu.Unlock()
	if !v.resident && !v.pending {
		v.resident = i >= 0 && i < v.maxLoRAs
	}
	return v
}

// adapterView is what a pick knows of one adapter on one replica (Replica.adapterView).
type adapterView struct {
	resident, pending bool
	// active is how many adapters have requests there; held how many it likely has in its
	// slots, active or not (an engine keeps an idle adapter until another needs its slot).
	active, held, maxLoRAs, queued int
}
