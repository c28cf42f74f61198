// Package blocklru is a least-recently-used set of 64-bit block hashes, intrusive over one
// slice, so that a lookup, a touch or an insert allocates nothing once the set is warm. It is
// the storage of the router's per-replica prefix index (policy) and of the simulated replica's
// KV cache (bench/replicasim), which differ in what they keep beside each block and in when
// they evict: each caller holds its own lock and decides when to Evict.
//
// Slots are stable while a hash is in the set, so a caller can keep per-slot data in a slice of
// its own (the router keeps each block's parent there).
package blocklru

// Set is the LRU set. The zero value is not ready: use New.
type Set struct {
	index   map[uint64]int32 // hash → slot in entries
	entries []entry
	head    int32 // most recently used; -1 when empty
	tail    int32 // least recently used; -1 when empty
	free    int32 // first unused slot, chained by next; valid while len(index) < len(entries)
}

type entry struct {
	hash       uint64
	prev, next int32
}

// New returns an empty set with room in its map for hint hashes.
func New(hint int) *Set {
	return &Set{index: make(map[uint64]int32, hint), head: -1, tail: -1, free: -1}
}

// Len is the number of hashes held.
func (s *Set) Len() int { return len(s.index) }

// Slot returns h's slot, if held.
func (s *Set) Slot(h uint64) (int32, bool) {
	slot, ok := s.index[h]
	return slot, ok
}

// Contains reports whether h is held.
func (s *Set) Contains(h uint64) bool {
	_, ok := s.index[h]
	return ok
}

// Hash is the hash a slot holds (meaningful only while it is held).
func (s *Set) Hash(slot int32) uint64 { return s.entries[slot].hash }

// Touch makes slot the most recently used.
func (s *Set) Touch(slot int32) {
	if s.head == slot {
		return
	}
	s.unlink(slot)
	s.pushFront(slot)
}

// Next is the slot used just less recently than slot, or -1 if slot is the least recently
// used.
func (s *Set) Next(slot int32) int32 { return s.entries[slot].next }

// TouchRun makes the slots from first to last, which must follow each other in recency order
// (Next leads from first to last), the most recently used, in the same order: what touching
// them one by one, last first, does, at the cost of one touch. A prompt's cached chain is
// usually one such run, or a few.
func (s *Set) TouchRun(first, last int32) {
	if s.head == first {
		return
	}
	f, l := &s.entries[first], &s.entries[last]
	s.entries[f.prev].next = l.next // first is not the head, so it has a prev
	if l.next >= 0 {
		s.entries[l.next].prev = f.prev
	} else {
		s.tail = f.prev
	}
	f.prev, l.next = -1, s.head
	s.entries[s.head].prev = last
	s.head = first
}

// Insert adds h, which must not be held, as the most recently used, and returns its slot (a
// freed one when there is one). It never evicts: callers Evict first, to their own bound.
func (s *Set) Insert(h uint64) int32 {
	var slot int32
	if len(s.index) < len(s.entries) {
		slot = s.free
		s.free = s.entries[slot].next
	} else {
		slot = int32(len(s.entries))
		s.entries = append(s.entries, entry{})
	}
	s.entries[slot].hash = h
	s.index[h] = slot
	s.pushFront(slot)
	return slot
}

// Evict drops the least recently used hash and returns the slot it freed. The set must not be
// empty.
func (s *Set) Evict() int32 {
	slot := s.tail
	s.unlink(slot)
	delete(s.index, s.entries[slot].hash)
	s.entries[slot] = entry{prev: -1, next: s.free}
	s.free = slot
	return slot
}

// Each calls f with every hash held, most recently used first.
func (s *Set) Each(f func(h uint64)) {
	for slot := s.head; slot >= 0; slot = s.entries[slot].next {
		f(s.entries[slot].hash)
	}
}

func (s *Set) unlink(slot int32) {
	e := &s.entries[slot]
	if e.prev >= 0 {
		s.entries[e.prev].next = e.next
	} else {
		s.head = e.next
	}
	if e.next >= 0 {
		s.entries[e.next].prev = e.prev
	} else {
		s.tail = e.prev
	}
	e.prev, e.next = -1, -1
}

func (s *Set) pushFront(slot int32) {
	e := &s.entries[slot]
	e.prev, e.next = -1, s.head
	if s.head >= 0 {
		s.entries[s.head].prev = slot
	}
	s.head = slot
	if s.tail < 0 {
		s.tail = slot
	}
}
