package sim

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// probe is a probe trace of zone us-central1-a at a 30 s gap.
func probe(data ...float64) *SpotTrace {
	return &SpotTrace{Zone: "us-central1-a", Provider: GCP, Region: "us-central1", Suffix: "c3-88", Gap: 30, Data: data, Probe: true}
}

// TestCountRule: the rule of DerivedSets, on traces small enough to count by hand.
func TestCountRule(t *testing.T) {
	tests := map[string]struct {
		rule  CountRule
		data  []float64
		want  []float64
		wantE string
	}{
		"always up counts every copy": {
			rule: CountRule{Copies: 4, Gap: 30}, data: []float64{1, 1, 1, 1}, want: []float64{4, 4, 4, 4},
		},
		"always down counts none": {
			rule: CountRule{Copies: 4, Gap: 60}, data: []float64{0, 0, 0, 0}, want: []float64{0, 0},
		},
		// N = 8, shift 2: copy k reads reading i+2k mod 8. The one 0 (reading 5) is read by
		// copy 0 at i=5, copy 1 at i=3, copy 2 at i=1, copy 3 at i=7.
		"one outage takes one instance at each of the copies' moments": {
			rule: CountRule{Copies: 4, Gap: 30}, data: []float64{1, 1, 1, 1, 1, 0, 1, 1},
			want: []float64{4, 3, 4, 3, 4, 3, 4, 3},
		},
		// Ticks of 2 readings: a copy counts only if up at both.
		"a copy counts when held through the whole tick": {
			rule: CountRule{Copies: 2, Gap: 60}, data: []float64{1, 0, 1, 1, 1, 1, 1, 1},
			// copy 0: readings (0,1) (2,3) (4,5) (6,7); copy 1: shifted 4, (4,5) (6,7) (0,1) (2,3).
			want: []float64{1, 2, 1, 2},
		},
		"a trailing partial tick is dropped": {
			rule: CountRule{Copies: 1, Gap: 90}, data: []float64{1, 1, 1, 1, 1}, want: []float64{1},
		},
		"one copy is the probe itself": {
			rule: CountRule{Copies: 1, Gap: 30}, data: []float64{0, 1, 1, 0}, want: []float64{0, 1, 1, 0},
		},
		"a gap that is not a multiple is refused": {
			rule: CountRule{Copies: 4, Gap: 45}, data: []float64{1, 1}, wantE: "whole multiple",
		},
		"a counted trace is refused": {
			rule: CountRule{Copies: 4, Gap: 30}, data: []float64{1, 2}, wantE: "probe trace",
		},
		"no copies is refused": {
			rule: CountRule{Copies: 0, Gap: 30}, data: []float64{1}, wantE: "at least 1",
		},
		"shorter than a tick is refused": {
			rule: CountRule{Copies: 4, Gap: 150}, data: []float64{1, 1}, wantE: "shorter than one derived tick",
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := tt.rule.Derive([]*SpotTrace{probe(tt.data...)})
			if tt.wantE != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantE) {
					t.Fatalf("err = %v, want one saying %q", err, tt.wantE)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got[0].Data); diff != "" {
				t.Errorf("counts (-want +got):\n%s", diff)
			}
			if got[0].Probe || got[0].Gap != tt.rule.Gap || got[0].Zone != "us-central1-a" || got[0].Provider != GCP {
				t.Errorf("derived trace %+v: want counted, gap %g, the probe's zone and cloud", got[0], tt.rule.Gap)
			}
		})
	}
}

// TestCountRuleKeepsZonesTogether: copy k of every zone reads the same moment, so zones that
// went down together come back down together.
func TestCountRuleKeepsZonesTogether(t *testing.T) {
	a, b := probe(1, 1, 0, 1, 1, 1), probe(1, 1, 0, 1, 1, 1)
	b.Zone = "us-central1-b"
	got, err := CountRule{Copies: 3, Gap: 30}.Derive([]*SpotTrace{a, b})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(got[0].Data, got[1].Data); diff != "" {
		t.Errorf("zones with one trace derive different counts (-a +b):\n%s", diff)
	}
	if diff := cmp.Diff([]float64{2, 3, 2, 3, 2, 3}, got[0].Data); diff != "" {
		t.Errorf("counts (-want +got):\n%s", diff)
	}
}
