package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// SpotTrace is one zone's spot availability, from skypilot-org/spot-traces.
//
// Reading: a value > 0 at tick i means spot capacity for this instance type could be had in the
// zone during [i·gap, (i+1)·gap); 0 means it could not. The single-node traces hold 0 or 1 (could
// one instance be launched), so a value > 0 is read as "the zone takes as many spot replicas as
// asked" and a value of 0 as "every spot replica in the zone is preempted and new launches
// there fail".
type SpotTrace struct {
	// Zone is the zone name the file is named after, e.g. us-east-1a.
	Zone string
	// Gap is the tick length in seconds (metadata.gap_seconds).
	Gap  float64
	Data []float64
}

// Available reports whether the zone has spot capacity at t seconds into the trace. Past its
// end the trace starts over.
func (s *SpotTrace) Available(t float64) bool {
	return s.Data[s.tick(t)] > 0
}

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

// LoadSpotTraces reads every *.json in dir; a file named us-east-1a_v100_1.json is zone
// us-east-1a (the part before the first underscore). Zones come back sorted by name.
func LoadSpotTraces(dir string) ([]*SpotTrace, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		if _, err := os.Stat(dir); err != nil {
			return nil, fmt.Errorf("spot traces: %w", err)
		}
		return nil, fmt.Errorf("spot traces: no *.json file in %s", dir)
	}
	sort.Strings(files)
	var out []*SpotTrace
	seen := map[string]string{}
	for _, f := range files {
		tr, err := LoadSpotTrace(f)
		if err != nil {
			return nil, err
		}
		if prev, ok := seen[tr.Zone]; ok {
			return nil, fmt.Errorf("spot traces: %s and %s are both zone %s", prev, f, tr.Zone)
		}
		seen[tr.Zone] = f
		out = append(out, tr)
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
	base := filepath.Base(path)
	tr.Zone, _, _ = strings.Cut(strings.TrimSuffix(base, ".json"), "_")
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
