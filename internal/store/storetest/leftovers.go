package storetest

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/launcher"
)

// listLeftovers is the ledger's list, which must work on every store.
func listLeftovers(t *testing.T, l launcher.Ledger) []launcher.Leftover {
	t.Helper()
	got, err := l.ListLeftovers()
	must(t, err)
	return got
}

// testLeftoversLedger: the ledger keeps every field (times to the nanosecond: a selector's
// Before is a cut-off compared with launch times, and its key spells it to the nanosecond),
// replaces by key, lists by key, forgets, forgets an unknown key without error, and keeps all
// of it across a restart, where a second store on the same state sees it too.
func testLeftoversLedger(t *testing.T, open Opener) {
	s := open(t)
	if got := listLeftovers(t, s); len(got) != 0 {
		t.Fatalf("leftovers of an empty store: %+v", got)
	}
	paris := time.FixedZone("CET", 3600)
	since := time.Date(2025, 3, 4, 5, 6, 7, 123456789, paris)
	// Put out of key order; byte order puts "i-10" before "i-2" before "select|…".
	sel := launcher.Leftover{Infra: "gcp", Selector: map[string]string{"ferry.dev/service": "chat", "ferry.dev/version": "2"},
		Before: time.Date(2025, 3, 4, 5, 0, 0, 987654321, time.UTC), Owner: "service chat",
		Reason: "gcp: 503 backendError", Since: since}
	sel.Key = launcher.LeftoverKey(sel)
	two := launcher.Leftover{Key: "i-2", Infra: "aws", InstanceID: "i-2", Owner: "job 7", Reason: "aws unavailable", Since: since.Add(time.Nanosecond)}
	ten := launcher.Leftover{Key: "i-10", Infra: "kubernetes/test", InstanceID: "i-10", Since: time.Now()}
	for _, l := range []launcher.Leftover{sel, two, ten} {
		must(t, s.PutLeftover(l))
	}
	want := []launcher.Leftover{ten, two, sel}
	if diff := cmp.Diff(want, listLeftovers(t, s)); diff != "" {
		t.Errorf("leftovers (-want +got):\n%s", diff)
	}

	// A put under a key that is there replaces the record whole.
	twoAgain := launcher.Leftover{Key: "i-2", Infra: "aws", InstanceID: "i-2", Reason: "aws throttled", Since: since.Add(time.Hour)}
	must(t, s.PutLeftover(twoAgain))
	want = []launcher.Leftover{ten, twoAgain, sel}
	if diff := cmp.Diff(want, listLeftovers(t, s)); diff != "" {
		t.Errorf("leftovers after replacing i-2 (-want +got):\n%s", diff)
	}

	must(t, s.DeleteLeftover("i-10"))
	if err := s.DeleteLeftover("i-10"); err != nil {
		t.Errorf("deleting i-10 again: %v, want no error", err)
	}
	if err := s.DeleteLeftover("select|aws|never=put|"); err != nil {
		t.Errorf("deleting a key never put: %v, want no error", err)
	}
	want = []launcher.Leftover{twoAgain, sel}
	if diff := cmp.Diff(want, listLeftovers(t, s)); diff != "" {
		t.Errorf("leftovers after deleting i-10 (-want +got):\n%s", diff)
	}

	s.Close()
	s, other := open(t), open(t) // a restarted controller, and another beside it
	for name, st := range map[string]launcher.Ledger{"reopened": s, "second": other} {
		if diff := cmp.Diff(want, listLeftovers(t, st)); diff != "" {
			t.Errorf("leftovers in the %s store (-want +got):\n%s", name, diff)
		}
	}
	must(t, other.DeleteLeftover(sel.Key))
	must(t, other.DeleteLeftover("i-2"))
	if got := listLeftovers(t, other); len(got) != 0 {
		t.Errorf("leftovers after deleting all: %+v", got)
	}
}

// testLeftoverWithoutKeyRefused: a record without a key could never be forgotten by key.
func testLeftoverWithoutKeyRefused(t *testing.T, open Opener) {
	s := open(t)
	if err := s.PutLeftover(launcher.Leftover{Infra: "aws", InstanceID: "i-1", Since: time.Now()}); err == nil {
		t.Error("a leftover without a key was accepted")
	}
	if got := listLeftovers(t, s); len(got) != 0 {
		t.Errorf("leftovers after refusing one: %+v", got)
	}
}
