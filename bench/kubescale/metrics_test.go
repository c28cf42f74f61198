package main

import (
	"math"
	"testing"
)

// TestHistogramQuantile checks quantile against what histogram_quantile returns for the same
// cumulative buckets.
func TestHistogramQuantile(t *testing.T) {
	inf := math.Inf(1)
	tests := map[string]struct {
		h    histogram
		q    float64
		want float64
	}{
		"empty": {h: histogram{}, q: 0.99, want: 0},
		"no observations": {
			h: histogram{bounds: []float64{0.1, inf}, counts: []float64{0, 0}}, q: 0.99, want: 0},
		"interpolated in the first bucket": {
			h: histogram{bounds: []float64{0.1, 1, inf}, counts: []float64{100, 100, 100}}, q: 0.5, want: 0.05},
		"interpolated in a middle bucket": {
			h: histogram{bounds: []float64{0.1, 1, inf}, counts: []float64{50, 100, 100}}, q: 0.99, want: 0.1 + 0.9*(99-50)/50.0},
		"rank in +Inf is the highest finite bound": {
			h: histogram{bounds: []float64{0.1, 1, inf}, counts: []float64{10, 90, 100}}, q: 0.99, want: 1},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := tc.h.quantile(tc.q); math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("quantile(%v) = %v, want %v", tc.q, got, tc.want)
			}
		})
	}
}
