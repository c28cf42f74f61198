package configs

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestResourcesString(t *testing.T) {
	tests := map[string]struct {
		r    Resources
		want string
	}{
		"one gpu on spot":     {Resources{Infra: "*", Accelerators: []Accelerator{{"A100", 1}}, UseSpot: true}, "1x A100 (spot)"},
		"cpus on local":       {Resources{Infra: InfraLocal, CPUs: "2"}, "cpus=2 (local)"},
		"gpu alternatives":    {Resources{Infra: "aws", Accelerators: []Accelerator{{"A100", 1}, {"L4", 0.5}}}, "1x A100|0.5x L4 (aws)"},
		"cpus and memory":     {Resources{CPUs: "4+", Memory: "16+"}, "cpus=4+ mem=16+"},
		"only infra":          {Resources{Infra: "gcp/us-central1", UseSpot: true}, "gcp/us-central1, spot"},
		"nothing":             {Resources{}, "any"},
		"any_of alternatives": {Resources{AnyOf: []Resources{{Infra: "aws", Accelerators: []Accelerator{{"A10G", 1}}}, {Infra: "gcp", Accelerators: []Accelerator{{"L4", 1}}}}}, "1x A10G (aws) | 1x L4 (gcp)"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := tc.r.String(); got != tc.want {
				t.Errorf("String() = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestParseAccelerator(t *testing.T) {
	tests := map[string]struct {
		in      string
		want    Accelerator
		wantErr bool
	}{
		"name only":          {in: "A100", want: Accelerator{"A100", 1}},
		"with count":         {in: "A100:8", want: Accelerator{"A100", 8}},
		"fraction":           {in: "H100:0.5", want: Accelerator{"H100", 0.5}},
		"dashes":             {in: "tpu-v5e-8:1", want: Accelerator{"tpu-v5e-8", 1}},
		"spaces trimmed":     {in: " L4 : 2 ", want: Accelerator{"L4", 2}},
		"bad count":          {in: "A100:x", wantErr: true},
		"two colons":         {in: "A100:1:2", wantErr: true},
		"no name":            {in: ":1", wantErr: true},
		"empty count":        {in: "A100:", wantErr: true},
		"zero":               {in: "A100:0", wantErr: true},
		"negative":           {in: "A100:-1", wantErr: true},
		"infinite":           {in: "A100:Inf", wantErr: true},
		"fraction above one": {in: "A100:1.5", wantErr: true},
		"starts with digit":  {in: "8xA100", wantErr: true},
		"empty":              {in: "", wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseAccelerator(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("ParseAccelerator(%q) error = %v, wantErr %v", tc.in, err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ParseAccelerator(%q) (-want +got):\n%s", tc.in, diff)
			}
		})
	}
}

func TestCandidates(t *testing.T) {
	single := Resources{Infra: "aws"}
	if diff := cmp.Diff([]Resources{single}, single.Candidates()); diff != "" {
		t.Errorf("single (-want +got):\n%s", diff)
	}
	ordered := Resources{Ordered: []Resources{{Infra: "aws"}, {Infra: "gcp"}}}
	if diff := cmp.Diff(ordered.Ordered, ordered.Candidates()); diff != "" {
		t.Errorf("ordered (-want +got):\n%s", diff)
	}
}

func TestSuggest(t *testing.T) {
	valid := []string{"replicas", "replica_policy", "readiness_probe", "ports"}
	tests := map[string]string{
		"replica":   `; did you mean "replicas"?`,
		"port":      `; did you mean "ports"?`,
		"readiness": `; did you mean "readiness_probe"?`,
		"Ports":     `; did you mean "ports"?`,
		"zzz":       ` (valid fields: replicas, replica_policy, readiness_probe, ports)`,
	}
	for in, want := range tests {
		if got := suggest(in, valid, "fields"); got != want {
			t.Errorf("suggest(%q) = %q, want %q", in, got, want)
		}
	}
}
