package controller

import (
	"testing"
	"time"

	"github.com/ferryserve/ferry/policy"
)

// TestSpotLossesView: the status says the hold Losses decides now, from how many recent gaps,
// and until when it holds; nothing before any loss.
func TestSpotLossesView(t *testing.T) {
	if v := spotLosses(policy.Losses{}, 0, time.Now(), true); v != nil {
		t.Errorf("view of no losses: %+v, want nil", v)
	}
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	var l policy.Losses
	for _, at := range []time.Duration{0, 20 * time.Minute, 40 * time.Minute, 70 * time.Minute, 110 * time.Minute} {
		l.Lost(t0.Add(at), "us-east-1a")
	}
	last := t0.Add(110 * time.Minute)
	for _, tc := range []struct {
		name      string
		now       time.Time
		wantGaps  int
		wantHold  time.Duration
		wantUntil time.Time
	}{
		// Gaps 20, 20, 30, 40 minutes: the 0.25 quantile is 20.
		{"holding", last.Add(10 * time.Minute), 4, 20 * time.Minute, last.Add(20 * time.Minute)},
		{"hold ended", last.Add(time.Hour), 4, 20 * time.Minute, time.Time{}},
		// A day on, only the last gap ends within HoldLookback: not a run.
		{"run over", t0.Add(24*time.Hour + 80*time.Minute), 1, 0, time.Time{}},
	} {
		v := spotLosses(l, 0, tc.now, true)
		if v.RecentGaps != tc.wantGaps || v.Hold != tc.wantHold || !v.HeldUntil.Equal(tc.wantUntil) {
			t.Errorf("%s: %d recent gaps, hold %v until %v; want %d, %v until %v", tc.name, v.RecentGaps, v.Hold, v.HeldUntil,
				tc.wantGaps, tc.wantHold, tc.wantUntil)
		}
	}
	if v := spotLosses(l, 0, last.Add(10*time.Minute), false); v.Hold != 0 || !v.HeldUntil.IsZero() || v.RecentGaps != 4 {
		t.Errorf("without a dynamic fallback: %+v; want the gaps and no hold", v)
	}
}
