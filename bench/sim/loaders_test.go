package sim

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSimLoadTrace(t *testing.T) {
	tr, err := LoadTrace("testdata/conv-400.csv")
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Records) != 400 {
		t.Fatalf("got %d records, want 400", len(tr.Records))
	}
	// The first two lines of the Azure conversation trace.
	want := []TraceRecord{{At: 0, ContextTokens: 374, GeneratedTokens: 44}, {At: 4.314579, ContextTokens: 396, GeneratedTokens: 109}}
	if diff := cmp.Diff(want, tr.Records[:2], cmp.Comparer(func(a, b float64) bool { return math.Abs(a-b) < 1e-6 })); diff != "" {
		t.Errorf("first records (-want +got):\n%s", diff)
	}
	span := tr.Records[399].At
	if gap := tr.Period - span; math.Abs(gap-span/399) > 1e-9 {
		t.Errorf("period %v: want span %v plus one mean gap %v", tr.Period, span, span/399)
	}
}

func TestSimParseTraceErrors(t *testing.T) {
	const header = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
	tests := map[string]struct {
		in   string
		want string
	}{
		"empty":          {"", "empty file"},
		"wrong header":   {"time,a,b\n", `line 1: header "time,a,b"`},
		"bad timestamp":  {header + "2023-11-16 18:15:46.6805900,374,44\nyesterday,1,1\n", "line 3: TIMESTAMP"},
		"bad tokens":     {header + "2023-11-16 18:15:46.6805900,374,-4\n", "line 2: tokens"},
		"not a number":   {header + "2023-11-16 18:15:46.6805900,lots,4\n", "line 2: tokens"},
		"missing column": {header + "2023-11-16 18:15:46.6805900,374\n", "record on line 2"},
		"out of order":   {header + "2023-11-16 18:15:46.6805900,1,1\n2023-11-16 18:15:45.0000000,1,1\n", "line 3: 2023-11-16 18:15:45.0000000 is earlier"},
		"no records":     {header, "no records"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := ParseTrace(strings.NewReader(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ParseTrace error = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestSimLoadTraceNamesFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.csv")
	if err := os.WriteFile(path, []byte("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,x,1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := LoadTrace(path)
	if err == nil || !strings.Contains(err.Error(), path+": line 2") {
		t.Errorf("LoadTrace error = %v, want the file and line 2", err)
	}
	if _, err := LoadTrace(filepath.Join(t.TempDir(), "missing.csv")); err == nil || !strings.Contains(err.Error(), "missing.csv") {
		t.Errorf("LoadTrace of a missing file = %v, want an error naming it", err)
	}
}

func TestSimLoopedTrace(t *testing.T) {
	tr := NewTrace("t", []TraceRecord{{At: 0, ContextTokens: 1, GeneratedTokens: 1}, {At: 10, ContextTokens: 2, GeneratedTokens: 2}})
	// Period 20: span 10 plus a mean gap of 10. Time-scale 2 halves every time.
	src := newLoopedTrace(tr, 2, 25)
	var got []float64
	for a, ok := src.next(); ok; a, ok = src.next() {
		got = append(got, a.at)
	}
	if diff := cmp.Diff([]float64{0, 5, 10, 15, 20}, got); diff != "" {
		t.Errorf("arrival times (-want +got):\n%s", diff)
	}
	if got, want := tr.MeanRate(2), 2.0/20*2; got != want {
		t.Errorf("MeanRate(2) = %v, want %v", got, want)
	}
}

func TestSimLoadSpotTraces(t *testing.T) {
	zones, err := LoadSpotTraces("testdata/spot-real")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, z := range zones {
		names = append(names, z.Zone)
	}
	if diff := cmp.Diff([]string{"us-east-1c", "us-east-2a", "us-west-2a", "us-west-2b"}, names); diff != "" {
		t.Errorf("zones (-want +got):\n%s", diff)
	}
	east1c := zones[0]
	tests := map[string]struct {
		at   float64
		want bool
	}{
		"tick 0 down":            {0, false},
		"tick 23 still down":     {23*195 + 194, false},
		"tick 24 up":             {24 * 195, true},
		"tick 36 up":             {36*195 + 1, true},
		"tick 37 down":           {37 * 195, false},
		"wraps after its end":    {48*195 + 24*195, true},
		"negative times wrap":    {-195 * 24, true},
		"long after still wraps": {100*48*195 + 30*195, true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := east1c.Available(tc.at); got != tc.want {
				t.Errorf("Available(%v) = %v, want %v", tc.at, got, tc.want)
			}
		})
	}
	if east1c.Duration() != 48*195 {
		t.Errorf("Duration = %v, want %v", east1c.Duration(), 48*195)
	}
}

func TestSimParseSpotTraceErrors(t *testing.T) {
	tests := map[string]struct {
		in   string
		want string
	}{
		"syntax error line": {"{\"metadata\": {\"gap_seconds\": 195},\n\"data\": [1, 0,, 1]}", "line 2"},
		"wrong type":        {"{\"metadata\": {\"gap_seconds\": \"soon\"},\n\"data\": [1]}", "line 1"},
		"no gap":            {`{"metadata": {}, "data": [1]}`, "gap_seconds"},
		"empty data":        {`{"metadata": {"gap_seconds": 60}, "data": []}`, "data is empty"},
		"negative value":    {`{"metadata": {"gap_seconds": 60}, "data": [1, -1]}`, "data[1]"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := ParseSpotTrace([]byte(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ParseSpotTrace error = %v, want it to contain %q", err, tc.want)
			}
		})
	}
	if _, err := LoadSpotTraces(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no *.json") {
		t.Errorf("LoadSpotTraces of an empty directory = %v", err)
	}
}

func TestSimMatchZones(t *testing.T) {
	rows, err := LoadCatalog("testdata/catalog/aws_gpu.csv")
	if err != nil {
		t.Fatal(err)
	}
	traces := []*SpotTrace{{Zone: "us-east-1a"}, {Zone: "us-east-1c"}, {Zone: "us-east-2b"}, {Zone: "us-west-2c"}, {Zone: "eu-west-1a"}}
	p, err := MatchZones(rows, "p3.2xlarge", traces)
	if err != nil {
		t.Fatal(err)
	}
	type zone struct {
		Name, AZID string
		Price      float64
		Median     bool
	}
	var got []zone
	for _, z := range p.Zones {
		got = append(got, zone{z.Name, z.AZID, z.SpotPrice, z.PriceNote != ""})
	}
	want := []zone{
		{"us-east-1a", "use1-az1", 0.5197, false},
		// use1-az3 has no spot price: median of us-east-1's 0.5197, 0.7657, 0.7031, 0.6827.
		{"us-east-1c", "use1-az3", (0.6827 + 0.7031) / 2, true},
		{"us-east-2b", "use2-az2", 0.3635, false},
		{"us-west-2c", "usw2-az3", 0.9724, false},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("zones (-want +got):\n%s", diff)
	}
	if p.OnDemand != 3.06 {
		t.Errorf("on-demand price %v, want 3.06 (the US regions')", p.OnDemand)
	}
	// eu-west-1 has p3 rows only for az2 and az3: eu-west-1a is dropped, with a note.
	if !strings.Contains(strings.Join(p.Notes, "\n"), "eu-west-1a dropped") {
		t.Errorf("notes %q do not report the dropped zone", p.Notes)
	}
	if _, err := MatchZones(rows, "p9.huge", traces); err == nil {
		t.Error("MatchZones accepted an instance type the catalog lacks")
	}
}

func TestSimParseCatalogErrors(t *testing.T) {
	const header = "instance_type,accelerator,accelerator_count,vcpus,memory_gib,gpu_memory_mib,ondemand_usd_per_hour,spot_usd_per_hour,region,zone\n"
	tests := map[string]struct {
		in   string
		want string
	}{
		"missing column": {"instance_type,zone\n", `header has no "ondemand_usd_per_hour"`},
		"bad price":      {header + "p3.2xlarge,V100,1,8,61,16384,3.06,cheap,us-east-1,use1-az1\n", `line 2: spot_usd_per_hour "cheap"`},
		"negative price": {header + "p3.2xlarge,V100,1,8,61,16384,-3,,us-east-1,use1-az1\n", "line 2: ondemand_usd_per_hour"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := ParseCatalog(strings.NewReader(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ParseCatalog error = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
