package configs

import (
	"strings"
	"testing"
)

// TestParseFerryConfigPriorities: kubernetes.serving_priority and max_priority are read, kept
// within the values the API allows users, and the serving value may not be above the cap.
func TestParseFerryConfigPriorities(t *testing.T) {
	cfg, err := ParseFerryConfig("config.yaml", []byte("kubernetes:\n  serving_priority: -5\n  max_priority: 0\n"))
	if err != nil {
		t.Fatal(err)
	}
	if k := cfg.Kubernetes; k.ServingPriority == nil || *k.ServingPriority != -5 || k.MaxPriority == nil || *k.MaxPriority != 0 {
		t.Fatalf("priorities %v %v, want -5 and 0", k.ServingPriority, k.MaxPriority)
	}
	tests := map[string]struct{ yaml, want string }{
		"serving above the cap": {"kubernetes:\n  serving_priority: 1000\n  max_priority: 100\n",
			"config.yaml:2:21: kubernetes.serving_priority: 1000 is above kubernetes.max_priority 100: set it at most 100"},
		"a system value": {"kubernetes:\n  max_priority: 1000000001\n",
			"config.yaml:2:17: kubernetes.max_priority: must be between -1000000000 and 1000000000"},
		"not an integer": {"kubernetes:\n  serving_priority: high\n",
			"config.yaml:2:21: kubernetes.serving_priority: expected an integer"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := ParseFerryConfig("config.yaml", []byte(tt.yaml))
			if got := Errors(err); len(got) != 1 || !strings.HasPrefix(got[0].Error(), tt.want) {
				t.Errorf("errors %v, want one starting %q", got, tt.want)
			}
		})
	}
}
