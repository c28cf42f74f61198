package sim

import (
	"os"
	"path/filepath"
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

// derivedRoot is a spot-traces root holding testdata's GCP probes where DerivedSets read
// them, beside testdata's AWS set.
func derivedRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, filepath.FromSlash(DerivedSets[0].From))
	for src, dst := range map[string]string{"testdata/spot-gcp": dir, "testdata/spot-real": filepath.Join(root, "spot-real")} {
		if err := os.MkdirAll(dst, 0o755); err != nil {
			t.Fatal(err)
		}
		files, _ := filepath.Glob(filepath.Join(src, "*.json"))
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dst, filepath.Base(f)), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return root
}

// TestSweepSetsDerived: the sweep runs the derived set after the sets on disk, --sets picks
// sets by the names the sweep reports, and a name it does not know is an error naming them.
func TestSweepSetsDerived(t *testing.T) {
	root := derivedRoot(t)
	names := func(sets []SpotSet) []string {
		var out []string
		for _, s := range sets {
			out = append(out, s.Name)
		}
		return out
	}
	tests := map[string]struct {
		sets  []string
		want  []string
		wantE string
	}{
		"every set, then the derived one": {want: []string{"preemption/1-node/gcp-04-30-2023", "spot-real", "derived/gcp-04-30-2023-counted"}},
		"only the derived one":            {sets: []string{"derived/gcp-04-30-2023-counted"}, want: []string{"derived/gcp-04-30-2023-counted"}},
		"an unknown name":                 {sets: []string{"derived/nope"}, wantE: "derived/nope not under"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := sweepSets(Options{SpotRoot: root, Sets: tt.sets})
			if tt.wantE != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantE) || !strings.Contains(err.Error(), "spot-real") {
					t.Fatalf("err = %v, want one saying %q and listing the sets", err, tt.wantE)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, names(got)); diff != "" {
				t.Errorf("sets (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDerivedSetPrices: the derived set is counted, keeps its zones, and is priced as its own
// instance (a2-highgpu-8g), not as Options.GCPInstanceType; a single run finds it by name.
func TestDerivedSetPrices(t *testing.T) {
	o := DefaultOptions()
	o.SpotRoot, o.CatalogDir, o.SpotDir = derivedRoot(t), "testdata/catalog", DerivedSets[0].Name
	p, err := newCatalogs(o).prices(o.spotSet())
	if err != nil {
		t.Fatal(err)
	}
	if p.InstanceType != "a2-highgpu-8g" || p.OnDemand != 29.38708 || p.Source != DerivedSets[0].Name {
		t.Errorf("priced as %s at $%v/h on-demand, source %q; want a2-highgpu-8g at 29.38708, the set's name", p.InstanceType, p.OnDemand, p.Source)
	}
	// 40 probe readings of 30 s: 8 ticks of 150 s. us-central1-a is down at reading 0 only,
	// which copy 0 reads in tick 0 (shift 10: copies 1-3 read it in ticks 6, 4 and 2);
	// us-east1-b is down throughout.
	want := map[string][]float64{
		"us-central1-a": {3, 4, 3, 4, 3, 4, 3, 4},
		"us-east1-b":    {0, 0, 0, 0, 0, 0, 0, 0},
	}
	for _, z := range p.Zones {
		if z.Trace.Probe || z.SpotPrice != 11.54364 || z.Trace.Gap != 150 {
			t.Errorf("%s: probe %v, spot $%v/h, gap %v; want counted, 11.54364, 150", z.Name, z.Trace.Probe, z.SpotPrice, z.Trace.Gap)
		}
		if diff := cmp.Diff(want[z.Name], z.Trace.Data); diff != "" {
			t.Errorf("%s counts (-want +got):\n%s", z.Name, diff)
		}
	}
	if len(p.Zones) != 2 {
		t.Errorf("%d zones, want 2", len(p.Zones))
	}
}
