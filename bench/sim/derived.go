package sim

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
)

// This file derives counted spot sets from probed (0/1) ones, so that a cloud whose traces here
// are all probes still gets a counted set in the sweep: the only GCP traces are four zones of
// c3-highcpu-88 probed every 30 s (preemption/1-node/gcp-04-30-2023), while issue 38's held-out
// check is GCP counted per zone. The rule was written down before the sweep first ran on its
// output (docs/measurements.md, "A held-out GCP counted set") and reads no result: it is not
// tuned, and its constants are fixed here, not flags.

// CountRule turns one zone's probe trace into a count of 0..Copies instances per tick of Gap
// seconds.
//
// Copy k (k = 0..Copies-1) of a zone is its probe trace shifted cyclically by k·⌊N/Copies⌋
// readings, N being the trace's length: copy k at reading i is the probe at reading
// (i + k·⌊N/Copies⌋) mod N. Each copy stands for one instance held in the zone. Derived tick j
// covers readings j·m … j·m+m-1, m = Gap ÷ the probe's gap, and there are ⌊N/m⌋ ticks; a copy
// counts in tick j when it is up (≥ 1) at every one of those readings, that is when its
// instance was held through the whole tick, which is what a counted set's value says. The
// zone's count at tick j is how many copies count.
//
// Copy k of every zone reads the same moment of the trace, so what the zones did together
// still happens together; the copies of one zone are its trace a quarter (for 4 copies) of its
// length apart, so one outage takes one instance at a time, at Copies moments of the horizon.
// Nothing here adds capacity the probes did not show: a zone counts Copies only where its
// probe was up at every reading the copies read.
type CountRule struct {
	// Copies is how many staggered copies are stacked: the count's maximum.
	Copies int
	// Gap is the derived tick in seconds, a whole multiple of the probe's gap.
	Gap float64
}

// Derive applies the rule to every zone of a probe set. The zones keep their names, cloud and
// region; each comes back as a counted trace (Probe false).
func (r CountRule) Derive(probes []*SpotTrace) ([]*SpotTrace, error) {
	out := make([]*SpotTrace, 0, len(probes))
	for _, p := range probes {
		data, err := r.counts(p)
		if err != nil {
			return nil, fmt.Errorf("deriving counts for %s: %w", p.Zone, err)
		}
		out = append(out, &SpotTrace{Zone: p.Zone, Provider: p.Provider, Region: p.Region,
			Suffix: p.Suffix, Gap: r.Gap, Data: data})
	}
	return out, nil
}

// counts is one zone's derived data (CountRule).
func (r CountRule) counts(p *SpotTrace) ([]float64, error) {
	if r.Copies < 1 {
		return nil, fmt.Errorf("copies %d: want at least 1", r.Copies)
	}
	m := r.Gap / p.Gap
	if m < 1 || m != math.Trunc(m) {
		return nil, fmt.Errorf("derived gap %gs: want a whole multiple of the probe's %gs", r.Gap, p.Gap)
	}
	for i, v := range p.Data {
		if v != 0 && v != 1 {
			return nil, fmt.Errorf("data[%d] is %v: the rule reads a probe trace (0 or 1)", i, v)
		}
	}
	per := int(m)
	n := len(p.Data)
	ticks := n / per
	if ticks == 0 {
		return nil, fmt.Errorf("%d readings of %gs: shorter than one derived tick of %gs", n, p.Gap, r.Gap)
	}
	shift := n / r.Copies
	data := make([]float64, ticks)
	for j := range ticks {
		for k := range r.Copies {
			held := true
			for i := j * per; i < (j+1)*per && held; i++ {
				held = p.Data[(i+k*shift)%n] >= 1
			}
			if held {
				data[j]++
			}
		}
	}
	return data, nil
}

// DerivedSet is a counted set the sweep builds from a probe set under the spot-traces root.
type DerivedSet struct {
	// Name is how the sweep reports it, under derived/.
	Name string
	// From is the probe set's directory, relative to the spot-traces root.
	From string
	Rule CountRule
	// GCPInstanceType prices the set's GCP zones instead of Options.GCPInstanceType: the
	// instance the counted set stands for.
	GCPInstanceType string
}

// DerivedSets are the derived sets the sweep runs. The GCP one stands for issue 38's held-out
// shape (GCP zones of A100×8 counted 0-4 every 150 s, with Compute Engine's 30 s notice,
// which every GCP zone gets): 4 copies, 150 s ticks, priced as a2-highgpu-8g (A100×8, the
// catalog's us-central1 and us-east1 rows, the same in both regions).
var DerivedSets = []DerivedSet{{
	Name:            "derived/gcp-04-30-2023-counted",
	From:            "preemption/1-node/gcp-04-30-2023",
	Rule:            CountRule{Copies: 4, Gap: 150},
	GCPInstanceType: "a2-highgpu-8g",
}}

// derivedSets are the DerivedSets whose probe set is under root, as the sweep runs them.
func derivedSets(root string) []SpotSet {
	var out []SpotSet
	for i := range DerivedSets {
		d := &DerivedSets[i]
		dir := filepath.Join(root, filepath.FromSlash(d.From))
		if st, err := os.Stat(dir); err == nil && st.IsDir() {
			out = append(out, SpotSet{Name: d.Name, Path: dir, Derived: d})
		}
	}
	return out
}

// spotSet is the set a single run reads: --spot-traces names a directory or pattern, or a
// derived set by its name (derived/gcp-04-30-2023-counted), built from under --spot-root.
func (o Options) spotSet() SpotSet {
	for i := range DerivedSets {
		if d := &DerivedSets[i]; o.SpotDir == d.Name {
			return SpotSet{Name: d.Name, Path: filepath.Join(o.SpotRoot, filepath.FromSlash(d.From)), Derived: d}
		}
	}
	return SpotSet{Name: o.SpotDir, Path: o.SpotDir}
}
