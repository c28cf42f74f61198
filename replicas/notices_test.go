package replicas

import (
	"testing"
	"time"

	"github.com/ferryserve/ferry/launcher"
)

// TestNoticeRelay: a notice no service claims yet (its records not loaded) is offered again
// until a service claims it or its reclaim time passes; a claimed one is not offered again.
func TestNoticeRelay(t *testing.T) {
	now := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
	known := map[string]bool{}
	offered := map[string]int{}
	r := noticeRelay{
		offer: func(n launcher.Notice, first bool) bool {
			if first != (offered[n.InstanceID] == 0) {
				t.Errorf("offer of %s: first %v after %d offers", n.InstanceID, first, offered[n.InstanceID])
			}
			offered[n.InstanceID]++
			return known[n.InstanceID]
		},
		now: func() time.Time { return now },
	}
	r.add(launcher.Notice{InstanceID: "claimed", At: now.Add(2 * time.Minute)})
	known["claimed"] = true
	r.add(launcher.Notice{InstanceID: "claimed-now", At: now.Add(2 * time.Minute)}) // not known: kept
	r.add(launcher.Notice{InstanceID: "foreign", At: now.Add(2 * time.Minute)})
	r.add(launcher.Notice{InstanceID: "reclaimed", At: now}) // seen at its reclaim: not kept
	// Kept: claimed (unknown at its add), claimed-now, foreign.
	if len(r.pending) != 3 {
		t.Fatalf("pending %v after the adds", r.pending)
	}
	known["claimed-now"] = true
	now = now.Add(time.Second)
	r.retry()
	if len(r.pending) != 1 || r.pending[0].InstanceID != "foreign" {
		t.Fatalf("pending %v after a retry; want only the foreign one", r.pending)
	}
	now = now.Add(2 * time.Minute)
	r.retry()
	if len(r.pending) != 0 {
		t.Fatalf("pending %v after the reclaim time; want none", r.pending)
	}
	if offered["reclaimed"] != 1 || offered["claimed-now"] != 2 {
		t.Errorf("offers %v; want reclaimed once, claimed-now twice", offered)
	}
}
