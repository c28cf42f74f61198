package blocklru

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestMatchesAPlainLRU drives the set and a slice-backed LRU with the same random touches,
// touches of runs, inserts and evictions: the order and the contents agree at every step, and freed slots are
// reused (the slice never outgrows the largest size held).
func TestMatchesAPlainLRU(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	s := New(0)
	var model []uint64 // most recent first
	largest := 0
	for step := range 20000 {
		h := uint64(rng.IntN(64)) + 1
		switch slot, ok := s.Slot(h); {
		case ok && rng.IntN(2) == 0:
			// The run from h through up to three less recently used slots.
			last, n := slot, 1
			for n < 4 && s.Next(last) >= 0 && rng.IntN(2) == 0 {
				last, n = s.Next(last), n+1
			}
			s.TouchRun(slot, last)
			at := slices.Index(model, h)
			run := slices.Clone(model[at : at+n])
			model = append(run, slices.Delete(model, at, at+n)...)
		case ok:
			s.Touch(slot)
			model = slices.DeleteFunc(model, func(x uint64) bool { return x == h })
			model = append([]uint64{h}, model...)
		case len(model) > 0 && rng.IntN(3) == 0:
			freed := s.Evict()
			if s.Contains(model[len(model)-1]) {
				t.Fatalf("step %d: evicted slot %d but %d still held", step, freed, model[len(model)-1])
			}
			model = model[:len(model)-1]
		default:
			slot := s.Insert(h)
			if s.Hash(slot) != h {
				t.Fatalf("step %d: slot %d holds %d, want %d", step, slot, s.Hash(slot), h)
			}
			model = append([]uint64{h}, model...)
		}
		largest = max(largest, len(model))
		var got []uint64
		s.Each(func(h uint64) { got = append(got, h) })
		if !slices.Equal(got, model) || s.Len() != len(model) {
			t.Fatalf("step %d: set %v (len %d), want %v", step, got, s.Len(), model)
		}
	}
	if len(s.entries) > largest {
		t.Errorf("%d slots for at most %d hashes: freed slots not reused", len(s.entries), largest)
	}
}

func BenchmarkTouchHit(b *testing.B) {
	s := New(1024)
	for h := range uint64(1024) {
		s.Insert(h + 1)
	}
	b.ReportAllocs()
	var h uint64
	for b.Loop() {
		h = h%1024 + 1
		slot, _ := s.Slot(h)
		s.Touch(slot)
	}
}

func BenchmarkInsertEvict(b *testing.B) {
	s := New(1024)
	for h := range uint64(1024) {
		s.Insert(h + 1)
	}
	b.ReportAllocs()
	h := uint64(1024)
	for b.Loop() {
		h++
		s.Evict()
		s.Insert(h)
	}
}
