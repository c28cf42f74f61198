package autoscaler

import "time"

// window keeps timed samples for the last span and answers sums and averages over any suffix
// of it (Knative's aggregation buckets, with one bucket per sample: the controller samples once
// a second, so a 60 s window holds 60 entries).
type window struct {
	span    time.Duration
	samples []sample // oldest first
}

type sample struct {
	at time.Time
	v  float64
}

func newWindow(span time.Duration) *window { return &window{span: span} }

// record adds a sample at now and drops those older than the span.
func (w *window) record(now time.Time, v float64) {
	w.samples = append(w.samples, sample{at: now, v: v})
	cut := 0
	for cut < len(w.samples) && now.Sub(w.samples[cut].at) >= w.span {
		cut++
	}
	if cut > 0 {
		w.samples = append(w.samples[:0], w.samples[cut:]...)
	}
}

// over returns the sum and count of samples taken in the last d before now.
func (w *window) over(now time.Time, d time.Duration) (sum float64, n int) {
	for i := len(w.samples) - 1; i >= 0 && now.Sub(w.samples[i].at) < d; i-- {
		sum += w.samples[i].v
		n++
	}
	return sum, n
}

// average is the mean sample of the last d, 0 with no sample.
func (w *window) average(now time.Time, d time.Duration) float64 {
	sum, n := w.over(now, d)
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}

// covered reports whether the samples reach back a full d (the window has filled since the
// scaler started), so that a fresh controller does not take an empty history for idleness.
func (w *window) covered(now time.Time, d time.Duration, tick time.Duration) bool {
	return len(w.samples) > 0 && now.Sub(w.samples[0].at)+tick >= d
}
