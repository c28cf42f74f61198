// Package loadgen is the load generator the bench drivers share: closed-loop workers bounded by
// duration and request count, an HTTP client for plain and server-sent-event (SSE) requests, and
// a latency histogram. It runs in the driver's process, so the driver's CPU pinning applies.
package loadgen

import (
	"math"
	"math/bits"
	"time"
)

// subBucketBits sets the histogram's precision: each power of two is split into 2^subBucketBits
// linear buckets, so a recorded value is known to within 1/128 (0.8 %) of itself, while values
// below 256 ns are exact. That is HdrHistogram's layout with a fixed precision. Values are
// clamped below 2^maxBits ns (about 18 minutes), far beyond any request the drivers allow.
const (
	subBucketBits  = 7
	subBucketCount = 1 << subBucketBits
	exactLimit     = 2 * subBucketCount // values below this have a bucket each
	maxBits        = 40
	maxTrackable   = 1<<maxBits - 1
	bucketCount    = exactLimit + (maxBits-subBucketBits-1)*subBucketCount
)

// Histogram records durations with bounded relative error in fixed memory (about 35 KB), so a
// worker can record millions of requests without allocating. It is not safe for concurrent use:
// give each worker its own and Merge them, or guard a shared one.
type Histogram struct {
	counts [bucketCount]uint64
	total  uint64
	sum    time.Duration
	min    time.Duration
	max    time.Duration
}

// bucketOf maps a non-negative value to its bucket index.
func bucketOf(v uint64) int {
	if v < exactLimit {
		return int(v)
	}
	shift := bits.Len64(v) - (subBucketBits + 1) // ≥ 1 here
	top := v >> uint(shift)                      // in [subBucketCount, 2*subBucketCount)
	return exactLimit + (shift-1)*subBucketCount + int(top-subBucketCount)
}

// bucketBounds returns the smallest and largest value that fall in bucket i.
func bucketBounds(i int) (lo, hi uint64) {
	if i < exactLimit {
		return uint64(i), uint64(i)
	}
	shift := uint((i-exactLimit)/subBucketCount + 1)
	top := uint64((i-exactLimit)%subBucketCount + subBucketCount)
	lo = top << shift
	return lo, lo + (1 << shift) - 1
}

// Record adds one observation; negative durations count as zero.
func (h *Histogram) Record(d time.Duration) {
	if d < 0 {
		d = 0
	}
	h.counts[bucketOf(uint64(min(d, maxTrackable)))]++
	if h.total == 0 || d < h.min {
		h.min = d
	}
	if d > h.max {
		h.max = d
	}
	h.total++
	h.sum += d
}

// Merge adds every observation of o to h.
func (h *Histogram) Merge(o *Histogram) {
	if o.total == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.total == 0 || o.min < h.min {
		h.min = o.min
	}
	if o.max > h.max {
		h.max = o.max
	}
	h.total += o.total
	h.sum += o.sum
}

// Count is the number of observations.
func (h *Histogram) Count() uint64 { return h.total }

// Mean is the exact mean, zero when empty.
func (h *Histogram) Mean() time.Duration {
	if h.total == 0 {
		return 0
	}
	return h.sum / time.Duration(h.total)
}

// Max is the exact largest observation.
func (h *Histogram) Max() time.Duration { return h.max }

// Min is the exact smallest observation.
func (h *Histogram) Min() time.Duration { return h.min }

// Quantile returns the value at quantile q in [0, 1] by the nearest-rank method: the smallest
// recorded value with at least ceil(q·n) observations at or below it, reported as the midpoint
// of its bucket and clamped to the exact min and max. Zero when empty.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.total == 0 {
		return 0
	}
	q = min(max(q, 0), 1)
	rank := uint64(math.Ceil(q * float64(h.total)))
	rank = max(rank, 1)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			lo, hi := bucketBounds(i)
			v := time.Duration(lo + (hi-lo)/2)
			return min(max(v, h.min), h.max)
		}
	}
	return h.max
}

// Summary is a histogram reduced to the figures the reports print, in milliseconds so that the
// JSON results read without unit conversion.
type Summary struct {
	Count  uint64  `json:"count"`
	MeanMs float64 `json:"mean_ms"`
	P50Ms  float64 `json:"p50_ms"`
	P90Ms  float64 `json:"p90_ms"`
	P99Ms  float64 `json:"p99_ms"`
	MaxMs  float64 `json:"max_ms"`
}

// Summarize reduces h to a Summary.
func (h *Histogram) Summarize() Summary {
	return Summary{
		Count:  h.total,
		MeanMs: Ms(h.Mean()),
		P50Ms:  Ms(h.Quantile(0.50)),
		P90Ms:  Ms(h.Quantile(0.90)),
		P99Ms:  Ms(h.Quantile(0.99)),
		MaxMs:  Ms(h.max),
	}
}

// Ms converts a duration to fractional milliseconds.
func Ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
