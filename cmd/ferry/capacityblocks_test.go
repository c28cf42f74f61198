package main

import (
	"io"
	"strings"
	"testing"
	"time"
)

// TestConfirmPurchase: only "buy" typed in full spends money; a bare Enter, which other
// prompts take as yes, does not.
func TestConfirmPurchase(t *testing.T) {
	for in, want := range map[string]bool{"buy\n": true, " buy \n": true, "\n": false, "y\n": false, "yes\n": false, "": false} {
		if got := confirmPurchase(strings.NewReader(in), io.Discard, "cb-offer-1"); got != want {
			t.Errorf("answer %q: bought %v, want %v", in, got, want)
		}
	}
}

// TestBlockFlags: durations follow EC2's rule; dates are a day or RFC 3339.
func TestBlockFlags(t *testing.T) {
	for in, want := range map[string]time.Duration{"1d": 24 * time.Hour, "14d": 14 * 24 * time.Hour, "21d": 21 * 24 * time.Hour} {
		if got, err := parseBlockDuration(in); err != nil || got != want {
			t.Errorf("--duration %s = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"36h", "15d", "soon", "189d"} {
		if _, err := parseBlockDuration(bad); err == nil {
			t.Errorf("--duration %s accepted", bad)
		}
	}
	if got, err := parseDay("--from", "2026-12-01"); err != nil || !got.Equal(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("--from 2026-12-01 = %v, %v", got, err)
	}
	if _, err := parseDay("--to", "next week"); err == nil || !strings.Contains(err.Error(), "--to") {
		t.Errorf("--to next week: %v", err)
	}
}
