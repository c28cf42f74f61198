package launcher

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestQueuedError(t *testing.T) {
	since := time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)
	err := fmt.Errorf("gcp: launch: %w", Queued(since, "resize request %s is %s", "rr-1", "ACCEPTED"))
	if !errors.Is(err, ErrQueued) || IsRetryable(err) {
		t.Fatalf("errors.Is(ErrQueued) = %v, IsRetryable = %v; want true, false", errors.Is(err, ErrQueued), IsRetryable(err))
	}
	q, ok := AsQueued(err)
	if !ok || !q.Since.Equal(since) || q.Reason != "resize request rr-1 is ACCEPTED" {
		t.Fatalf("AsQueued = %+v, %v", q, ok)
	}
	if !strings.Contains(err.Error(), "since 2026-11-26T00:00:00Z") {
		t.Errorf("message %q does not say since when", err)
	}
	if q, ok := AsQueued(fmt.Errorf("k8s: %w", ErrQueued)); !ok || !q.Since.IsZero() {
		t.Errorf("a bare ErrQueued: %+v, %v", q, ok)
	}
	if _, ok := AsQueued(ErrNoCapacity); ok {
		t.Error("ErrNoCapacity taken for a queue")
	}
}

func TestReservationWindow(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	block := ReservationOffer{Start: now.Add(time.Hour), End: now.Add(3 * time.Hour), Count: 4, InUse: 1}
	odcr := ReservationOffer{Count: 2, InUse: 3}
	tests := []struct {
		name string
		got  bool
		want bool
	}{
		{"block not active before its start", block.Active(now), false},
		{"block active inside", block.Active(now.Add(2 * time.Hour)), true},
		{"block not active at its end", block.Active(now.Add(3 * time.Hour)), false},
		{"open reservation always active", odcr.Active(now), true},
		{"2h from the window's start fits", block.Covers(now, 2*time.Hour), true},
		{"3h does not", block.Covers(now, 3*time.Hour), false},
		{"no limit never fits a window with an end", block.Covers(now, 0), false},
		{"no limit fits an open reservation", odcr.Covers(now, 0), true},
	}
	for _, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("%s: got %v", tc.name, tc.got)
		}
	}
	if block.Free() != 3 || odcr.Free() != 0 {
		t.Errorf("Free = %d, %d; want 3, 0", block.Free(), odcr.Free())
	}
}
