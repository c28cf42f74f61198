package loadgen

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestHistogramExactBelow256ns(t *testing.T) {
	var h Histogram
	for v := range 100 {
		h.Record(time.Duration(v + 1)) // 1..100 ns
	}
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{{0, 1}, {0.01, 1}, {0.5, 50}, {0.9, 90}, {0.99, 99}, {1, 100}} {
		if got := h.Quantile(tc.q); got != tc.want {
			t.Errorf("Quantile(%v) = %v, want %v", tc.q, got, tc.want)
		}
	}
	if h.Count() != 100 || h.Min() != 1 || h.Max() != 100 || h.Mean() != 50 { // mean 50.5 truncates
		t.Errorf("count %d min %v max %v mean %v", h.Count(), h.Min(), h.Max(), h.Mean())
	}
}

// TestHistogramRelativeError compares quantiles with the exact nearest-rank values of the same
// samples, spread over six orders of magnitude.
func TestHistogramRelativeError(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var h Histogram
	samples := make([]time.Duration, 20000)
	for i := range samples {
		// log-uniform between 1 µs and 1 s
		d := time.Duration(float64(time.Microsecond) * math.Pow(10, rng.Float64()*6))
		samples[i] = d
		h.Record(d)
	}
	slices.Sort(samples)
	for _, q := range []float64{0.1, 0.5, 0.9, 0.99, 0.999} {
		rank := int(float64(len(samples))*q+0.999999) - 1
		exact := samples[rank]
		got := h.Quantile(q)
		if diff := float64(got-exact) / float64(exact); diff > 1.0/128 || diff < -1.0/128 {
			t.Errorf("Quantile(%v) = %v, exact %v: relative error %.4f over 1/128", q, got, exact, diff)
		}
	}
}

func TestHistogramBucketsRoundTrip(t *testing.T) {
	for _, v := range []uint64{0, 1, 255, 256, 257, 511, 512, 1000, 1 << 20, 123456789, maxTrackable} {
		i := bucketOf(v)
		if i < 0 || i >= bucketCount {
			t.Fatalf("bucketOf(%d) = %d, outside [0, %d)", v, i, bucketCount)
		}
		lo, hi := bucketBounds(i)
		if v < lo || v > hi {
			t.Errorf("bucketOf(%d) = %d with bounds [%d, %d]", v, i, lo, hi)
		}
		if i > 0 {
			_, prevHi := bucketBounds(i - 1)
			if prevHi+1 != lo {
				t.Errorf("bucket %d starts at %d, previous ends at %d", i, lo, prevHi)
			}
		}
	}
}

func TestHistogramMergeAndClamp(t *testing.T) {
	var a, b Histogram
	a.Record(time.Millisecond)
	b.Record(3 * time.Millisecond)
	b.Record(-time.Second) // counts as zero
	b.Record(time.Hour)    // beyond the range: clamped into the last bucket, max stays exact
	a.Merge(&b)
	a.Merge(&Histogram{})
	if a.Count() != 4 {
		t.Fatalf("count %d, want 4", a.Count())
	}
	if a.Min() != 0 || a.Max() != time.Hour {
		t.Errorf("min %v max %v, want 0 and 1h", a.Min(), a.Max())
	}
	if got := a.Quantile(0.5); got < time.Millisecond*127/128 || got > time.Millisecond*129/128 {
		t.Errorf("median %v, want about 1ms", got)
	}
	var empty Histogram
	if empty.Quantile(0.99) != 0 || empty.Mean() != 0 {
		t.Error("empty histogram should report zeros")
	}
	if s := a.Summarize(); s.Count != 4 || s.MaxMs != 3.6e6 {
		t.Errorf("summary %+v", s)
	}
}

func TestHistogramRecordDoesNotAllocate(t *testing.T) {
	var h Histogram
	if n := testing.AllocsPerRun(1000, func() { h.Record(1234567) }); n != 0 {
		t.Errorf("Record allocates %v times", n)
	}
}
