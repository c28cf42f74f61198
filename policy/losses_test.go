package policy

import (
	"encoding/json"
	"testing"
	"time"
)

// Losses in a run hold the fallback for the run's usual gap; calm spot holds nothing.
func TestLossesHoldForTheRunsGap(t *testing.T) {
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	var l Losses
	if l.Holding(t0) || l.Hold(t0) != 0 {
		t.Fatal("holding before any loss")
	}
	// A run: losses 20, 20, 30 and 40 minutes apart, plus notices of one reclaim arriving
	// 10 s apart, which are one loss.
	at := t0
	for _, gap := range []time.Duration{0, 20 * time.Minute, 20 * time.Minute, 30 * time.Minute, 40 * time.Minute} {
		at = at.Add(gap)
		l.Lost(at, "a")
		l.Lost(at.Add(10*time.Second), "b")
	}
	if len(l.Gaps) != 4 {
		t.Fatalf("gaps %v: want 4 (a reclaim's notices are one loss)", l.Gaps)
	}
	if l.Zones["a"].Count != 5 || l.Zones["b"].Count != 5 || !l.Zones["b"].Last.Equal(at.Add(10*time.Second)) {
		t.Errorf("zones %+v: want 5 losses in each, b's last 10 s after a's", l.Zones)
	}
	// Each loss took 2 instances: the hold keeps 2 on-demand replicas and one more.
	if k := l.HoldOnDemand(at); k != 3 {
		t.Errorf("hold keeps %d on-demand, want 3", k)
	}
	// Each gap starts at the previous loss's last notice: 20, 20, 30, 40 minutes less 10 s.
	// Their 0.25 quantile (index 0 of 0..3) is 19m50s, so the hold ends 20 minutes after
	// the first notice of the last loss.
	if h := l.Hold(at); h != 20*time.Minute-10*time.Second {
		t.Errorf("hold %v, want 19m50s", h)
	}
	if !l.Holding(at.Add(19*time.Minute)) || l.Holding(at.Add(20*time.Minute)) {
		t.Error("the hold does not end 20 minutes after the last loss")
	}
	// A day later the run is over: its gaps are older than HoldLookback.
	if h, k := l.Hold(at.Add(25*time.Hour)), l.HoldOnDemand(at.Add(25*time.Hour)); h != 0 || k != 0 {
		t.Errorf("hold %v keeping %d a day after the run, want none", h, k)
	}
}

// A reclaim whose notices arrive over minutes, each within LossMerge of the one before, is
// one loss, not a run of short gaps.
func TestLossesMergeADrawnOutReclaim(t *testing.T) {
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	var l Losses
	for i := range 8 {
		l.Lost(t0.Add(time.Duration(i)*50*time.Second), "a")
	}
	if len(l.Gaps) != 0 || !l.Last.Equal(t0.Add(350*time.Second)) || l.Zones["a"].Count != 8 {
		t.Errorf("losses %+v: want one loss ending at its last notice, 8 in zone a", l)
	}
}

// Two gaps are not a run; long gaps hold at most HoldMost.
func TestLossesHoldNeedsARunAndIsBounded(t *testing.T) {
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	var l Losses
	for i := range 3 {
		l.Lost(t0.Add(time.Duration(i)*5*time.Minute), "")
	}
	if l.Holding(t0.Add(11 * time.Minute)) {
		t.Error("held after two gaps")
	}
	var long Losses
	for i := range 6 {
		long.Lost(t0.Add(time.Duration(i)*3*time.Hour), "")
	}
	if h := long.Hold(t0.Add(15 * time.Hour)); h != HoldMost {
		t.Errorf("hold %v for 3-hour gaps, want HoldMost %v", h, HoldMost)
	}
	for i := range 2 * keepGaps {
		long.Lost(t0.Add(time.Duration(20+i)*time.Hour), "")
	}
	if len(long.Gaps) != keepGaps || len(long.Sizes) != keepGaps+1 {
		t.Errorf("%d gaps and %d sizes kept, want %d and %d", len(long.Gaps), len(long.Sizes), keepGaps, keepGaps+1)
	}
}

// The state survives a round trip through JSON, as the controller saves it.
func TestLossesJSON(t *testing.T) {
	var l Losses
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	for i := range 5 {
		l.Lost(t0.Add(time.Duration(i)*10*time.Minute), "z")
	}
	back, b := roundTrip(t, l)
	now := t0.Add(45 * time.Minute)
	if back.Hold(now) != l.Hold(now) || !back.Last.Equal(l.Last) || len(back.Gaps) != len(l.Gaps) || back.Zones["z"].Count != 5 {
		t.Errorf("round trip %s: %+v, want %+v", b, back, l)
	}
	if b, _ := json.Marshal(Losses{}); string(b) != "{}" {
		t.Errorf("empty losses marshal to %s", b)
	}
}

// Held keeps the live on-demand replicas while holding, up to the target, and lets the
// fallback grow.
func TestHeld(t *testing.T) {
	for _, tc := range []struct {
		want               Mix
		live, target, keep int
		out                Mix
	}{
		{Mix{Spot: 6}, 4, 6, 10, Mix{Spot: 6, OnDemand: 4}},
		{Mix{Spot: 6}, 4, 6, 0, Mix{Spot: 6}},
		{Mix{Spot: 6}, 4, 6, 2, Mix{Spot: 6, OnDemand: 2}},
		{Mix{Spot: 6, OnDemand: 5}, 2, 6, 10, Mix{Spot: 6, OnDemand: 5}},
		{Mix{Spot: 3}, 8, 3, 10, Mix{Spot: 3, OnDemand: 3}},
		{Mix{}, 2, -1, 10, Mix{}},
	} {
		if got := Held(tc.want, tc.live, tc.target, tc.keep); got != tc.out {
			t.Errorf("Held(%+v, %d, %d, %d) = %+v, want %+v", tc.want, tc.live, tc.target, tc.keep, got, tc.out)
		}
	}
}

// A live on-demand stand-in for a missing spare stays until the spare is READY on spot, whether
// spot launches fail now or not; none is kept beyond it, nor without a spare or a dynamic fallback.
func TestKeepStandIn(t *testing.T) {
	dynamic := MixSpec{UseSpot: true, DynamicFallback: true}
	for name, tc := range map[string]struct {
		mix             MixSpec
		readySpot, live int
		spare           Spare
		want            Mix
	}{
		"spare missing, failure count reset": {dynamic, 4, 1, Spare{Spot: 1}, Mix{Spot: 5, OnDemand: 1}},
		"spare missing, two live":            {dynamic, 4, 2, Spare{Spot: 1}, Mix{Spot: 5, OnDemand: 1}},
		"spare READY on spot":                {dynamic, 5, 1, Spare{Spot: 1}, Mix{Spot: 5}},
		"none live: none launched":           {dynamic, 4, 0, Spare{Spot: 1}, Mix{Spot: 5}},
		"no spare":                           {dynamic, 4, 1, Spare{}, Mix{Spot: 4}},
		"no dynamic fallback":                {MixSpec{UseSpot: true}, 4, 1, Spare{Spot: 1}, Mix{Spot: 5}},
	} {
		t.Run(name, func(t *testing.T) {
			want := Split(4, tc.mix, tc.readySpot, tc.spare)
			if got := KeepStandIn(want, 4, tc.mix, tc.readySpot, tc.spare, tc.live); got != tc.want {
				t.Errorf("KeepStandIn = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// A zone that held no more than the service runs there asks for a spare while the service
// holds as many there again, for HoldLookback; a zone left empty, or one below its ceiling,
// asks for none.
func TestLossesSpareWhileAZoneSitsAtItsCeiling(t *testing.T) {
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	var l Losses
	held := map[string]int{"a": 3, "b": 3}
	if n := l.Spare(t0, held); n != 0 {
		t.Fatalf("spare %d before any ceiling, want 0", n)
	}
	l.Capped(t0, "a", 0) // a reclaim that emptied the zone: an outage
	l.Capped(t0, "", 3)  // no zone known
	if n := l.Spare(t0, held); n != 0 || len(l.Zones) != 0 {
		t.Fatalf("spare %d, zones %v after an empty zone and an unnamed one, want none", n, l.Zones)
	}
	l.Capped(t0, "a", 3) // every zone refused a launch with 3 in a
	if n := l.Spare(t0.Add(time.Hour), held); n != 1 {
		t.Errorf("spare %d with a at its ceiling, want 1", n)
	}
	if n := l.Spare(t0.Add(time.Hour), map[string]int{"a": 2, "b": 3}); n != 0 {
		t.Errorf("spare %d with a below its ceiling, want 0", n)
	}
	if n := l.Spare(t0.Add(HoldLookback+time.Second), held); n != 0 {
		t.Errorf("spare %d a day after the ceiling was seen, want 0", n)
	}
	// A reclaim leaves 2 in a: a lower ceiling, seen now.
	l.Capped(t0.Add(2*time.Hour), "a", 2)
	if z := l.Zones["a"]; z.Ceiling != 2 || !z.CeilingAt.Equal(t0.Add(2*time.Hour)) {
		t.Errorf("zone a %+v: want ceiling 2 seen at +2h", z)
	}
	if n := l.Spare(t0.Add(3*time.Hour), map[string]int{"a": 2}); n != 1 {
		t.Errorf("spare %d with a at its new ceiling, want 1", n)
	}
	// A zone's reclaim whose notices arrive one by one leaves no ceiling once the last one
	// has left the zone empty: it was an outage.
	at := t0.Add(5 * time.Hour)
	l.Capped(at, "b", 2)
	l.Capped(at.Add(10*time.Second), "b", 1)
	l.Capped(at.Add(20*time.Second), "b", 0)
	if n := l.Spare(at.Add(time.Hour), map[string]int{"b": 3}); n != 0 || l.Zones["b"].Ceiling != 0 {
		t.Errorf("spare %d, zone b %+v after a reclaim that emptied it, want none", n, l.Zones["b"])
	}
	// The ceiling survives a save and a load, as the losses do.
	back, b := roundTrip(t, l)
	if n := back.Spare(t0.Add(3*time.Hour), map[string]int{"a": 2}); n != 1 {
		t.Errorf("spare %d after a round trip through JSON (%s), want 1", n, b)
	}
}

// roundTrip is l saved as JSON and read back, and the JSON.
func roundTrip(t *testing.T, l Losses) (Losses, []byte) {
	t.Helper()
	b, err := json.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	var back Losses
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	return back, b
}
