package autoscaler

import "time"

// window keeps the timed samples of the last span with their running sum, so recording and
// averaging cost O(1) however long the window (Knative's aggregation buckets, with one bucket
// per sample: the controller samples once a second, so a 60 s window holds 60 entries, and the
// simulator runs 20-minute windows for simulated weeks).
type window struct {
	span time.Duration
	// samples[head:] are in the window, oldest first; the slice is compacted once the expired
	// prefix grows past half of it.
	samples []sample
	head    int
	sum     float64
}

type sample struct {
	at time.Time
	v  float64
}

func newWindow(span time.Duration) *window { return &window{span: span} }

// record adds a sample at now and drops those older than the span.
func (w *window) record(now time.Time, v float64) {
	w.samples = append(w.samples, sample{at: now, v: v})
	w.sum += v
	w.expire(now)
}

// expire drops the samples older than the span at now.
func (w *window) expire(now time.Time) {
	for w.head < len(w.samples) && now.Sub(w.samples[w.head].at) >= w.span {
		w.sum -= w.samples[w.head].v
		w.head++
	}
	if w.head > len(w.samples)/2 {
		w.samples = append(w.samples[:0], w.samples[w.head:]...)
		w.head = 0
		// Re-add from scratch so that float error from the running updates never builds up.
		w.sum = 0
		for _, s := range w.samples {
			w.sum += s.v
		}
	}
}

// total returns the sum and count of the samples in the window.
func (w *window) total() (sum float64, n int) { return w.sum, len(w.samples) - w.head }

// average is the mean sample in the window, 0 with no sample.
func (w *window) average() float64 {
	sum, n := w.total()
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}

// covered reports whether the samples reach back a full span (the window has filled since the
// scaler started), so that a fresh controller does not take an empty history for idleness.
// tick is the interval between samples.
func (w *window) covered(now time.Time, tick time.Duration) bool {
	return w.head < len(w.samples) && now.Sub(w.samples[w.head].at)+tick >= w.span
}
