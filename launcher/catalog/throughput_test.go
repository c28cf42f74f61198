package catalog

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The rate of a GPU comes from GPU traces only, the nearest in accelerator and place; a CPU
// type's from CPU traces (GCP's traced c3-88 saw none in its hours, which said nothing of
// GCP's GPUs and scored them as never interrupted).
func TestInterruptionRateByKind(t *testing.T) {
	tests := []struct {
		cloud, region, acc string
		basis              string
		exact, zero        bool
	}{
		{"aws", "us-east-1", "V100", "aws us-east-1 V100:", true, false},
		{"aws", "eu-west-1", "V100", "aws V100 (other regions):", false, false},
		{"aws", "us-east-1", "A100", "aws us-east-1 GPU (not A100):", false, false},
		{"gcp", "us-central1", "A100", "GPU on other clouds (no gcp GPU trace):", false, false},
		{"gcp", "us-central1", "V100", "V100 on other clouds:", false, false},
		{"gcp", "us-central1", "", "gcp us-central1 CPU:", true, true},
		{"aws", "us-east-1", "", "aws us-east-1 CPU:", true, false},
	}
	for _, tt := range tests {
		rate, basis, exact, ok := InterruptionRate(tt.cloud, tt.region, tt.acc)
		if !ok || !strings.HasPrefix(basis, tt.basis) || exact != tt.exact || (rate == 0) != tt.zero {
			t.Errorf("%s %s %q: %v %q exact %v ok %v, want basis %q exact %v zero %v", tt.cloud, tt.region, tt.acc, rate, basis, exact, ok, tt.basis, tt.exact, tt.zero)
		}
	}
	if _, _, _, ok := InterruptionRate("azure", "eastus", ""); ok {
		t.Error("a cloud with no CPU trace has a CPU rate")
	}
}

// A fleet's own history replaces the embedded traces; one that cannot be read or parsed is
// reported, and the embedded traces rank meanwhile.
func TestOwnInterruptionHistory(t *testing.T) {
	dir := t.TempDir()
	own := filepath.Join(dir, "own.csv")
	if err := os.WriteFile(own, []byte("cloud,region,zone,traced,instance_hours,interruptions\naws,us-east-1,us-east-1a,v100_1,10,20\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	embedded, _, _, _ := InterruptionRate("aws", "us-east-1", "V100")
	t.Setenv(EnvSpotInterruptions, own)
	if rate, _, _, _ := InterruptionRate("aws", "us-east-1", "V100"); rate != 2 || CheckInterruptions() != nil {
		t.Errorf("own history: rate %v, err %v; want 2/h", rate, CheckInterruptions())
	}
	bad := filepath.Join(dir, "bad.csv")
	if err := os.WriteFile(bad, []byte("cloud,region,zone,traced,instance_hours,interruptions\naws,us-east-1,a,v100_1,-1,2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{bad, filepath.Join(dir, "missing.csv")} {
		t.Setenv(EnvSpotInterruptions, path)
		rate, _, _, _ := InterruptionRate("aws", "us-east-1", "V100")
		if err := CheckInterruptions(); err == nil || !strings.Contains(err.Error(), EnvSpotInterruptions) || rate != embedded {
			t.Errorf("%s: rate %v err %v; want the embedded %v and the reason", path, rate, err, embedded)
		}
	}
}
