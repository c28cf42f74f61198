package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"
)

// SpotTrace is one zone's spot capacity, from skypilot-org/spot-traces (the format SpotHedge's
// artifact reads too).
//
// Reading: the value at tick i is how many spot instances of the trace's type the zone held
// during [i·gap, (i+1)·gap). The counted sets (4-node, 16-node) probed that many instances, so
// a value is a count: a launch beyond it is refused, and a drop below what a policy holds
// reclaims the excess. The single-instance sets (every value 0 or 1) say only whether one
// instance could be had, not how many; there a 1 is read as capacity for any number, as
// SpotHedge's artifact reads its 1-node set (Probe), and a 0 as none.
type SpotTrace struct {
	// Zone is the zone as its cloud writes it: us-east-1a (AWS) or us-central1-a (GCP).
	Zone string
	// Provider and Region follow from the zone's name.
	Provider Provider
	Region   string
	// Suffix is the rest of the file name: the traced instance (v100_1, c3-88).
	Suffix string
	// Gap is the tick length in seconds (metadata.gap_seconds).
	Gap  float64
	Data []float64
	// Probe is true when the trace's set holds only 0s and 1s: a 1 then means capacity for
	// any number of instances (Unbounded).
	Probe bool
}

// Provider is the cloud a zone belongs to; it decides the zone's notice and price rows.
type Provider string

// The providers the traces come from.
const (
	AWS Provider = "aws"
	GCP Provider = "gcp"
)

// Unbounded is the capacity of a probed zone that could give one instance: as many as asked.
const Unbounded = math.MaxInt32

// Capacity is how many spot instances the zone holds at t seconds into the trace. Past its
// end the trace starts over.
func (s *SpotTrace) Capacity(t float64) int {
	v := s.Data[s.tick(t)]
	switch {
	case v <= 0:
		return 0
	case s.Probe:
		return Unbounded
	}
	return int(math.Min(v, Unbounded))
}

// Available reports whether the zone has any spot capacity at t.
func (s *SpotTrace) Available(t float64) bool { return s.Capacity(t) > 0 }

// tick is the index of the data point covering t, wrapping at the end.
func (s *SpotTrace) tick(t float64) int {
	i := int(math.Floor(t / s.Gap))
	n := len(s.Data)
	return ((i % n) + n) % n
}

// Duration is the trace's length in seconds.
func (s *SpotTrace) Duration() float64 { return s.Gap * float64(len(s.Data)) }

// spotFile is the file format: {"metadata":{"gap_seconds":N},"data":[...]}.
type spotFile struct {
	Metadata struct {
		GapSeconds float64 `json:"gap_seconds"`
	} `json:"metadata"`
	Data []float64 `json:"data"`
}

// Zone names as each cloud writes them: AWS puts the zone letter right after the region's
// number (us-east-1a), GCP after a dash (us-central1-a).
var (
	awsZone = regexp.MustCompile(`^([a-z]{2}(?:-gov)?-[a-z]+-[0-9]+)([a-z])$`)
	gcpZone = regexp.MustCompile(`^([a-z]+-[a-z]+[0-9]+)-([a-z])$`)
)

// ParseZone splits a zone name into its cloud, region and zone letter.
func ParseZone(name string) (p Provider, region string, letter byte, ok bool) {
	if m := awsZone.FindStringSubmatch(name); m != nil {
		return AWS, m[1], m[2][0], true
	}
	if m := gcpZone.FindStringSubmatch(name); m != nil {
		return GCP, m[1], m[2][0], true
	}
	return "", "", 0, false
}

// LoadSpotTraces reads one set of zones: a directory's *.json files, or the files a glob
// pattern names (dir/*_v100_1.json, for a directory that holds several traced instances). A
// file named us-east-1a_v100_1.json is zone us-east-1a (the part before the first underscore).
// Every zone must be of one cloud; zones come back sorted by name.
func LoadSpotTraces(path string) ([]*SpotTrace, error) {
	pattern := path
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		pattern = filepath.Join(path, "*.json")
	} else if err != nil && !strings.ContainsAny(path, "*?[") {
		return nil, fmt.Errorf("spot traces: %w", err)
	}
	files, err := filepath.Glob(pattern)
	if err != nil {
		return nil, fmt.Errorf("spot traces %s: %w", path, err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("spot traces: no *.json file in %s", path)
	}
	sort.Strings(files)
	var out []*SpotTrace
	seen := map[string]string{}
	probe := true
	for _, f := range files {
		tr, err := LoadSpotTrace(f)
		if err != nil {
			return nil, err
		}
		if prev, ok := seen[tr.Zone]; ok {
			return nil, fmt.Errorf("spot traces: %s and %s are both zone %s (pass a pattern such as %s to pick one traced instance)",
				prev, f, tr.Zone, filepath.Join(filepath.Dir(f), "*_"+tr.Suffix+".json"))
		}
		if len(out) > 0 && tr.Provider != out[0].Provider {
			return nil, fmt.Errorf("spot traces: %s is a %s zone and %s a %s one: a set is of one cloud", out[0].Zone, out[0].Provider, tr.Zone, tr.Provider)
		}
		seen[tr.Zone] = f
		out = append(out, tr)
		for _, v := range tr.Data {
			if v != 0 && v != 1 {
				probe = false
				break
			}
		}
	}
	for _, tr := range out {
		tr.Probe = probe
	}
	return out, nil
}

// LoadSpotTrace reads one zone's file.
func LoadSpotTrace(path string) (*SpotTrace, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("spot trace: %w", err)
	}
	tr, err := ParseSpotTrace(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	tr.Zone, tr.Suffix, _ = strings.Cut(strings.TrimSuffix(filepath.Base(path), ".json"), "_")
	var ok bool
	if tr.Provider, tr.Region, _, ok = ParseZone(tr.Zone); !ok {
		return nil, fmt.Errorf("%s: zone %q is neither an AWS zone name (us-east-1a) nor a GCP one (us-central1-a)", path, tr.Zone)
	}
	return tr, nil
}

// ParseSpotTrace decodes the JSON of one zone, checking what the simulator relies on.
func ParseSpotTrace(b []byte) (*SpotTrace, error) {
	var f spotFile
	if err := json.Unmarshal(b, &f); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, fmt.Errorf("line %d: %w", lineOf(b, se.Offset), err)
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, fmt.Errorf("line %d: %w", lineOf(b, te.Offset), err)
		}
		return nil, err
	}
	if !(f.Metadata.GapSeconds > 0) {
		return nil, fmt.Errorf("metadata.gap_seconds is %v: want a positive number", f.Metadata.GapSeconds)
	}
	if len(f.Data) == 0 {
		return nil, errors.New("data is empty")
	}
	for i, v := range f.Data {
		if v < 0 || math.IsNaN(v) {
			return nil, fmt.Errorf("data[%d] is %v: want a count ≥ 0", i, v)
		}
	}
	return &SpotTrace{Gap: f.Metadata.GapSeconds, Data: f.Data}, nil
}

// lineOf is the 1-based line of byte offset off in b.
func lineOf(b []byte, off int64) int {
	off = min(max(off, 0), int64(len(b)))
	return 1 + strings.Count(string(b[:off]), "\n")
}

// SpotSet is one set of zone traces the sweep runs on: a directory's files of one traced
// instance.
type SpotSet struct {
	// Name is the directory under the spot-traces root, and the traced instance when the
	// directory holds several.
	Name string
	// Path is what LoadSpotTraces takes: the directory, or a pattern for one instance.
	Path string
	// Derived, when set, is the rule that makes this set's counts from the probes at Path.
	Derived *DerivedSet
}

// FindSpotSets lists every set under root (../shared/data/spot-traces): each directory holding
// *.json traces, split by traced instance where it holds several, in name order.
func FindSpotSets(root string) ([]SpotSet, error) {
	var out []SpotSet
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		files, err := filepath.Glob(filepath.Join(path, "*.json"))
		if err != nil || len(files) == 0 {
			return err
		}
		var suffixes []string
		for _, f := range files {
			_, suffix, _ := strings.Cut(strings.TrimSuffix(filepath.Base(f), ".json"), "_")
			if !slices.Contains(suffixes, suffix) {
				suffixes = append(suffixes, suffix)
			}
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if len(suffixes) == 1 {
			out = append(out, SpotSet{Name: rel, Path: path})
			return nil
		}
		sort.Strings(suffixes)
		for _, s := range suffixes {
			out = append(out, SpotSet{Name: rel + " " + s, Path: filepath.Join(path, "*_"+s+".json")})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("spot trace sets: %w", err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("spot trace sets: no directory of *.json traces under %s", root)
	}
	return out, nil
}

// setDuration is the shortest zone's length: how much of the set every zone covers.
func setDuration(zones []Zone) time.Duration {
	d := math.Inf(1)
	for _, z := range zones {
		d = math.Min(d, z.Trace.Duration())
	}
	return time.Duration(d * float64(time.Second))
}
