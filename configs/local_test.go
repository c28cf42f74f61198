package configs

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseFerryConfigLocal(t *testing.T) {
	cfg, err := ParseFerryConfig("config.yaml", []byte("local:\n  accelerators: {L4: 2, T4: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := &LocalConfig{Accelerators: []Accelerator{{"L4", 2}, {"T4", 1}}}
	if diff := cmp.Diff(want, cfg.Local); diff != "" {
		t.Errorf("local (-want +got):\n%s", diff)
	}
	cfg, err = ParseFerryConfig("config.yaml", []byte("local:\n  cpus: 16\n  memory: 64GB\n"))
	if err != nil || cfg.Local.CPUs != 16 || cfg.Local.MemoryGiB != 64 {
		t.Errorf("cpus and memory: %v %+v", err, cfg.Local)
	}
	for yaml, wantErr := range map[string]string{
		"local:\n  memory: 64+\n":          "config.yaml:2:11: local.memory: give this machine's memory in GiB",
		"local:\n  cpus: -1\n":             "config.yaml:2:9: local.cpus",
		"local:\n  accelerators: L4:0.5\n": "config.yaml:2:17: local.accelerators: L4:0.5: give whole devices",
		"local:\n  gpus: 1\n":              "config.yaml:2:3: local.gpus: unknown field",
	} {
		_, err := ParseFerryConfig("config.yaml", []byte(yaml))
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("%q: error %v, want it to contain %q", yaml, err, wantErr)
		}
	}
}
