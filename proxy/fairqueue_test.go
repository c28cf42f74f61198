package proxy

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/tenants"
)

// queueScript pushes waiters named "tenant/class/i" and pops them all, returning the order.
type queueScript struct {
	q       fairQueue
	waiters map[string]*waiter
}

func (s *queueScript) push(name string) {
	parts := strings.Split(name, "/")
	p, err := tenants.ParsePriority(parts[1])
	if err != nil {
		panic(err)
	}
	w := &waiter{class: classIndex(p), tenant: parts[0]}
	if s.waiters == nil {
		s.waiters = map[string]*waiter{}
	}
	s.waiters[name] = w
	s.q.push(w)
}

func (s *queueScript) nameOf(w *waiter) string {
	for name, x := range s.waiters {
		if x == w {
			return name
		}
	}
	return "?"
}

func (s *queueScript) popAll() []string {
	var out []string
	for w := s.q.pop(); w != nil; w = s.q.pop() {
		out = append(out, s.nameOf(w))
	}
	return out
}

// TestFairQueueOrder: classes first, then tenants in turns, each tenant's requests in arrival
// order; a tenant that starts waiting is served after at most one grant to each other tenant.
func TestFairQueueOrder(t *testing.T) {
	tests := map[string]struct {
		push []string
		want []string
	}{
		"classes": {
			push: []string{"a/batch/1", "a/standard/1", "a/interactive/1", "a/standard/2", "a/batch/2"},
			want: []string{"a/interactive/1", "a/standard/1", "a/standard/2", "a/batch/1", "a/batch/2"},
		},
		"turns": {
			push: []string{"h/standard/1", "h/standard/2", "h/standard/3", "l/standard/1", "m/standard/1", "m/standard/2"},
			want: []string{"h/standard/1", "l/standard/1", "m/standard/1", "h/standard/2", "m/standard/2", "h/standard/3"},
		},
		"turns within each class": {
			push: []string{"h/batch/1", "h/batch/2", "l/batch/1", "h/interactive/1", "h/interactive/2", "l/interactive/1"},
			want: []string{"h/interactive/1", "l/interactive/1", "h/interactive/2", "h/batch/1", "l/batch/1", "h/batch/2"},
		},
		"anonymous is one tenant": {
			push: []string{"/standard/1", "/standard/2", "k/standard/1"},
			want: []string{"/standard/1", "k/standard/1", "/standard/2"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var s queueScript
			for _, n := range tc.push {
				s.push(n)
			}
			if diff := cmp.Diff(tc.want, s.popAll()); diff != "" {
				t.Errorf("order (-want +got):\n%s", diff)
			}
			if s.q.len() != 0 {
				t.Errorf("len = %d after popping all", s.q.len())
			}
		})
	}
}

// TestFairQueueLightTenantWaitsOneTurn: with a heavy tenant's fifty requests waiting and its
// turn under way, a light tenant's single request is served after at most one more of them.
func TestFairQueueLightTenantWaitsOneTurn(t *testing.T) {
	var s queueScript
	for i := range 50 {
		s.push(fmt.Sprintf("heavy/standard/%d", i))
	}
	s.q.pop()
	s.q.pop()
	s.push("light/standard/0")
	for i := 1; ; i++ {
		if w := s.q.pop(); s.nameOf(w) == "light/standard/0" {
			if i > 2 {
				t.Errorf("the light tenant's request was served %d grants after it arrived, want at most 2", i)
			}
			return
		}
	}
}

// TestFairQueueRemove: a waiter leaves from anywhere.
func TestFairQueueRemove(t *testing.T) {
	var s queueScript
	for _, n := range []string{"a/standard/1", "a/standard/2", "b/standard/1", "c/standard/1", "c/standard/2"} {
		s.push(n)
	}
	s.q.remove(s.waiters["a/standard/2"])
	s.q.remove(s.waiters["b/standard/1"])
	s.q.remove(s.waiters["b/standard/1"]) // not queued: nothing
	want := []string{"a/standard/1", "c/standard/1", "c/standard/2"}
	if diff := cmp.Diff(want, s.popAll()); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
}

// TestFairQueueVictim: a full queue sheds the newest request of the lowest class below the
// newcomer's; within the newcomer's class (but batch), the newest of a tenant at least two
// requests heavier than the newcomer's.
func TestFairQueueVictim(t *testing.T) {
	tests := map[string]struct {
		push       []string
		newcomer   string // tenant/class
		wantVictim string // "" for none
	}{
		"interactive sheds the newest batch":        {[]string{"a/batch/1", "b/batch/2", "a/standard/1"}, "c/interactive", "b/batch/2"},
		"interactive sheds standard without batch":  {[]string{"a/standard/1", "b/standard/2", "a/interactive/1"}, "c/interactive", "b/standard/2"},
		"standard sheds batch":                      {[]string{"a/batch/1", "a/interactive/1"}, "c/standard", "a/batch/1"},
		"batch sheds nothing":                       {[]string{"a/batch/1", "a/batch/2", "a/batch/3"}, "c/batch", ""},
		"no lower class, equal tenants":             {[]string{"a/standard/1", "b/standard/1"}, "c/standard", ""},
		"no lower class, a heavy tenant":            {[]string{"a/standard/1", "a/standard/2", "b/standard/1"}, "c/standard", "a/standard/2"},
		"the heavy tenant itself":                   {[]string{"a/standard/1", "a/standard/2"}, "a/standard", ""},
		"heavier by one only":                       {[]string{"a/standard/1", "a/standard/2", "c/standard/1"}, "c/standard", ""},
		"interactive does not shed its own class":   {[]string{"a/interactive/1"}, "b/interactive", ""},
		"heavy interactive tenant gives way":        {[]string{"a/interactive/1", "a/interactive/2"}, "b/interactive", "a/interactive/2"},
		"empty queue":                               {nil, "a/standard", ""},
		"standard does not shed interactive":        {[]string{"a/interactive/1", "a/interactive/2"}, "b/standard", ""},
		"lowest class first, not the nearest below": {[]string{"a/batch/1", "a/standard/1"}, "b/interactive", "a/batch/1"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var s queueScript
			for _, n := range tc.push {
				s.push(n)
			}
			parts := strings.Split(tc.newcomer, "/")
			p, _ := tenants.ParsePriority(parts[1])
			got := ""
			if w := s.q.victim(classIndex(p), parts[0]); w != nil {
				got = s.nameOf(w)
			}
			if got != tc.wantVictim {
				t.Errorf("victim = %q, want %q", got, tc.wantVictim)
			}
		})
	}
}

// TestFairQueueRandomOps checks the invariants against a model under random pushes, pops,
// removals and put-backs: the count, every class before the next, each tenant's requests in
// order, and turns that never let a tenant be served twice while another waiting tenant of the
// class is not served at all.
func TestFairQueueRandomOps(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var q fairQueue
	var queued []*waiter
	seq := map[*waiter]int{}
	lastServed := map[string]int{} // tenant/class → sequence of the last request served
	for i := range 20000 {
		switch op := rng.IntN(10); {
		case op < 5 || len(queued) == 0:
			w := &waiter{class: rng.IntN(numClasses), tenant: fmt.Sprint(rng.IntN(5))}
			seq[w] = i
			q.push(w)
			queued = append(queued, w)
		case op < 8:
			w := q.pop()
			best := numClasses
			for _, x := range queued {
				best = min(best, x.class)
			}
			if w.class != best {
				t.Fatalf("popped class %d while class %d waits", w.class, best)
			}
			key := fmt.Sprint(w.tenant, "/", w.class)
			if seq[w] < lastServed[key] {
				t.Fatalf("tenant %s served out of order", key)
			}
			lastServed[key] = seq[w]
			queued = slices.DeleteFunc(queued, func(x *waiter) bool { return x == w })
		default:
			j := rng.IntN(len(queued))
			q.remove(queued[j])
			queued = slices.Delete(queued, j, j+1)
		}
		if q.len() != len(queued) {
			t.Fatalf("len = %d, model %d", q.len(), len(queued))
		}
	}
	for len(queued) > 0 {
		w := q.pop()
		queued = slices.DeleteFunc(queued, func(x *waiter) bool { return x == w })
	}
	if q.pop() != nil || q.len() != 0 {
		t.Error("the queue is not empty after popping every waiter")
	}
	for c := range q.classes {
		if cq := &q.classes[c]; cq.turn != nil || cq.oldest != nil || cq.newest != nil || len(cq.tenants) != 0 {
			t.Errorf("class %d keeps state when empty: %+v", c, cq)
		}
	}
}

// BenchmarkFairQueue is one push and one pop with waiters of 16 tenants across the three
// classes waiting: the work the slot queue's lock covers per waiting request. It allocates
// nothing once every tenant's record exists.
func BenchmarkFairQueue(b *testing.B) {
	var q fairQueue
	ws := make([]waiter, 1024)
	for i := range ws {
		ws[i] = waiter{class: i % numClasses, tenant: fmt.Sprint(i % 16)}
	}
	for i := range 512 {
		q.push(&ws[i])
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		w := q.pop()
		w.class = i % numClasses
		q.push(w)
	}
}
