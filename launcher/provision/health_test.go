package provision

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ferryserve/ferry/launcher"
)

func newTestHealth(clk *clock) *Health {
	return NewHealth(HealthOptions{Now: clk.now, Rand: rand.New(rand.NewPCG(1, 2))})
}

func TestHealthOpensAfterFailuresAndClosesOnAnswer(t *testing.T) {
	clk := &clock{t: time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)}
	h := newTestHealth(clk)
	h.Register("gcp")
	unavailable := fmt.Errorf("%w: 503 backendError", launcher.ErrUnavailable)
	for i := range 2 {
		h.Observe("gcp", "", unavailable)
		if err := h.Allow("gcp", ""); err != nil {
			t.Fatalf("after %d failure(s) the breaker is open: %v", i+1, err)
		}
	}
	h.Observe("gcp", "", unavailable)
	err := h.Allow("gcp", "us-central1-a")
	var down *DownError
	if !errors.As(err, &down) || !errors.Is(err, launcher.ErrUnavailable) || down.State.Failures != 3 {
		t.Fatalf("after 3 failures: Allow = %v, want a DownError wrapping ErrUnavailable with 3 failures", err)
	}
	if s := h.State("gcp", ""); s.State != StateDown || !s.Since.Equal(clk.t) || s.LastClass != ClassUnavailable {
		t.Fatalf("state %+v, want down since now with class unavailable", s)
	}
	// A DownError fed back (a call that never went) changes nothing.
	h.Observe("gcp", "", err)
	if s := h.State("gcp", ""); s.Failures != 3 {
		t.Fatalf("a call that never went counted: %+v", s)
	}
	// Capacity is an answer: the infra is up again.
	clk.t = clk.t.Add(time.Minute)
	h.Observe("gcp", "", fmt.Errorf("%w: ZONE_RESOURCE_POOL_EXHAUSTED", launcher.ErrNoCapacity))
	if err := h.Allow("gcp", ""); err != nil {
		t.Fatalf("after an answer: %v", err)
	}
	if got := h.Errors()[ErrorKey{"gcp", ClassUnavailable}]; got != 3 {
		t.Fatalf("unavailable errors counted %d, want 3", got)
	}
	if got := h.Errors()[ErrorKey{"gcp", ClassCapacity}]; got != 1 {
		t.Fatalf("capacity errors counted %d, want 1", got)
	}
}

func TestHealthTimeoutOpensAtOnce(t *testing.T) {
	clk := &clock{t: time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)}
	h := newTestHealth(clk)
	h.Observe("aws", "", fmt.Errorf("%w: no answer within 10s: %w", launcher.ErrUnavailable, context.DeadlineExceeded))
	if s := h.State("aws", ""); s.State != StateDown || s.LastClass != ClassTimeout {
		t.Fatalf("after one timeout: %+v, want down (timeout)", s)
	}
	// A caller's own cancel is nobody's failure.
	h2 := newTestHealth(clk)
	h2.Observe("aws", "", context.Canceled)
	if s := h2.State("aws", ""); s.State != StateUp || len(h2.Errors()) != 0 {
		t.Fatalf("a cancel was counted: %+v %v", s, h2.Errors())
	}
}

func TestHealthThrottlingBacksOffWithJitterAndStaysUp(t *testing.T) {
	clk := &clock{t: time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)}
	h := newTestHealth(clk)
	throttled := fmt.Errorf("%w: RequestLimitExceeded", launcher.ErrThrottled)
	var waits []time.Duration
	for range 8 {
		h.Observe("aws", "", throttled)
		s := h.State("aws", "")
		if s.State != StateThrottled {
			t.Fatalf("throttled infra in state %q", s.State)
		}
		if err := h.Allow("aws", ""); !errors.Is(err, launcher.ErrThrottled) {
			t.Fatalf("while backing off: Allow = %v, want ErrThrottled", err)
		}
		waits = append(waits, s.RetryAt.Sub(clk.t))
		clk.t = s.RetryAt
		if err := h.Allow("aws", ""); err != nil {
			t.Fatalf("after the back-off: Allow = %v", err)
		}
	}
	for i, w := range waits {
		base := min(time.Second<<i, time.Minute)
		if w < base*8/10 || w > base*12/10 {
			t.Errorf("back-off %d = %v, want %v ± 20%%", i, w, base)
		}
	}
	h.Observe("aws", "", nil)
	h.Observe("aws", "", throttled)
	if w := h.State("aws", "").RetryAt.Sub(clk.t); w > 1200*time.Millisecond {
		t.Fatalf("after a success the back-off starts over, got %v", w)
	}
}

func TestHealthZonesApart(t *testing.T) {
	clk := &clock{t: time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)}
	h := newTestHealth(clk)
	gone := fmt.Errorf("%w: zone us-central1-f", launcher.ErrNotFound)
	h.observeList("gcp", []launcher.Gap{{Infra: "gcp", Region: "us-central1", Zone: "us-central1-f", Err: gone}})
	h.observeList("gcp", []launcher.Gap{{Infra: "gcp", Region: "us-central1", Zone: "us-central1-f", Err: gone}})
	h.observeList("gcp", []launcher.Gap{{Infra: "gcp", Region: "us-central1", Zone: "us-central1-f", Err: gone}})
	if err := h.Allow("gcp", "us-central1-f"); !errors.Is(err, launcher.ErrUnavailable) {
		t.Fatalf("the missing zone: Allow = %v, want it down", err)
	}
	if err := h.Allow("gcp", "us-central1-a"); err != nil {
		t.Fatalf("another zone: %v", err)
	}
	if err := h.Allow("gcp", ""); err != nil {
		t.Fatalf("the infra: %v", err)
	}
	// A list that reads every zone closes it.
	h.observeList("gcp", nil)
	if err := h.Allow("gcp", "us-central1-f"); err != nil {
		t.Fatalf("after a complete list: %v", err)
	}
	// A not-found instance is not the infra's failure.
	for range 5 {
		h.Observe("gcp", "", fmt.Errorf("%w: instance x", launcher.ErrNotFound))
	}
	if err := h.Allow("gcp", ""); err != nil {
		t.Fatalf("instances not found closed the infra: %v", err)
	}
}

func TestHealthProbesDueOncePerCooldown(t *testing.T) {
	clk := &clock{t: time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)}
	h := newTestHealth(clk)
	h.Observe("aws", "", fmt.Errorf("%w: %w", launcher.ErrUnavailable, context.DeadlineExceeded))
	if due := h.dueProbes(clk.t); len(due) != 0 {
		t.Fatalf("probe due before the cooldown: %v", due)
	}
	first := h.State("aws", "").RetryAt
	clk.t = first
	if due := h.dueProbes(clk.t); len(due) != 1 || due[0] != "aws" {
		t.Fatalf("due = %v, want aws", due)
	}
	if due := h.dueProbes(clk.t); len(due) != 0 {
		t.Fatalf("a second probe while one is out: %v", due)
	}
	h.Observe("aws", "", fmt.Errorf("%w: still", launcher.ErrUnavailable))
	h.probed("aws")
	if gap := h.State("aws", "").RetryAt.Sub(clk.t); gap < 3*time.Second {
		t.Fatalf("the cooldown did not grow after a failed probe: %v", gap)
	}
}
