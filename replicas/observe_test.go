package replicas

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestObserveReconcile checks that every reconcile pass is reported with its duration: the
// controller's ferry_reconcile_duration_seconds{loop="replicas"} is fed from it.
func TestObserveReconcile(t *testing.T) {
	var passes, negative atomic.Int64
	h := newHarness(t, newFakeProvider(t), newFakeStore(), newFakeClock(), func(c *Config) {
		c.ObserveReconcile = func(d time.Duration) {
			passes.Add(1)
			if d < 0 {
				negative.Add(1)
			}
		}
	})
	h.m.SetDesired(1)
	h.start()
	deadline := time.Now().Add(10 * time.Second)
	for passes.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d reconcile passes observed in 10s at a 20ms interval, want at least 3", passes.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if negative.Load() > 0 {
		t.Error("a pass was observed with a negative duration")
	}
}
