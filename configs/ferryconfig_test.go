package configs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseFerryConfig(t *testing.T) {
	cfg, err := ParseFerryConfig("config.yaml", []byte(`
kubernetes:
  kubeconfig: /etc/kube/config
  provision_timeout_seconds: 5
  contexts:
    - name: gpu-cluster
      namespace: ferry
      cost_per_hour: 1.5
    - spare
`))
	if err != nil {
		t.Fatal(err)
	}
	want := &KubernetesConfig{
		Kubeconfig:              "/etc/kube/config",
		ProvisionTimeoutSeconds: 5,
		Contexts:                []KubernetesContext{{Name: "gpu-cluster", Namespace: "ferry", CostPerHour: 1.5}, {Name: "spare"}},
	}
	if diff := cmp.Diff(want, cfg.Kubernetes); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
}

func TestParseFerryConfigErrors(t *testing.T) {
	_, err := ParseFerryConfig("config.yaml", []byte(`kubernetes:
  kubeconfg: /x
  provision_timeout_seconds: 0
  contexts:
    - name: a
      namespace: Not_A_Namespace
      cost_per_hour: -1
    - a
    - namespace: b
`))
	got := Errors(err)
	want := []string{
		"config.yaml:2:3: kubernetes.kubeconfg: unknown field",
		"config.yaml:3:30: kubernetes.provision_timeout_seconds: must be at least 1",
		"config.yaml:6:18: kubernetes.contexts[0].namespace:",
		"config.yaml:7:22: kubernetes.contexts[0].cost_per_hour: must be 0 or more",
		"config.yaml:8:7: kubernetes.contexts[1]: context \"a\" is listed twice",
		"config.yaml:9:7: kubernetes.contexts[2]: a context needs a name",
	}
	if len(got) != len(want) {
		t.Fatalf("got %d errors, want %d:\n%v", len(got), len(want), err)
	}
	for i, w := range want {
		if !strings.HasPrefix(got[i].Error(), w) {
			t.Errorf("error %d = %q, want prefix %q", i, got[i].Error(), w)
		}
	}
}

func TestLoadFerryConfigMissingIsEmpty(t *testing.T) {
	cfg, err := LoadFerryConfig(filepath.Join(t.TempDir(), "config.yaml"))
	if err != nil || cfg.Kubernetes != nil {
		t.Fatalf("got %+v, %v; want the empty config", cfg, err)
	}
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte("kubernetes: [1]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadFerryConfig(path); err == nil || !strings.Contains(err.Error(), path+":1:13: kubernetes") {
		t.Fatalf("err = %v, want file:line:col", err)
	}
}
