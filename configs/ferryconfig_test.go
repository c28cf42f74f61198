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
  proxy_pod_labels: {app.kubernetes.io/name: ferry, app.kubernetes.io/component: proxy}
  proxy_namespace: ferry-system
  proxy_cidrs: [203.0.113.7/32]
  checkpoint_size: 50Gi
  checkpoint_storage_class: efs-sc
`))
	if err != nil {
		t.Fatal(err)
	}
	want := &KubernetesConfig{
		Kubeconfig:              "/etc/kube/config",
		ProvisionTimeoutSeconds: 5,
		Contexts:                []KubernetesContext{{Name: "gpu-cluster", Namespace: "ferry", CostPerHour: 1.5}, {Name: "spare"}},
		ProxyPodLabels:          map[string]string{"app.kubernetes.io/name": "ferry", "app.kubernetes.io/component": "proxy"},
		ProxyNamespace:          "ferry-system",
		ProxyCIDRs:              []string{"203.0.113.7/32"},
		CheckpointSize:          "50Gi",
		CheckpointStorageClass:  "efs-sc",
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
  proxy_pod_labels: {"bad key!": x, app: "not a value"}
  proxy_namespace: Ferry
  proxy_cidrs: 10.0.0.0/8
  checkpoint_size: 10 GB
  checkpoint_storage_class: EFS_SC
`))
	got := Errors(err)
	want := []string{
		"config.yaml:2:3: kubernetes.kubeconfg: unknown field",
		"config.yaml:3:30: kubernetes.provision_timeout_seconds: must be at least 1",
		"config.yaml:6:18: kubernetes.contexts[0].namespace:",
		"config.yaml:7:22: kubernetes.contexts[0].cost_per_hour: must be 0 or more",
		"config.yaml:8:7: kubernetes.contexts[1]: context \"a\" is listed twice",
		"config.yaml:9:7: kubernetes.contexts[2]: a context needs a name",
		"config.yaml:10:22: kubernetes.proxy_pod_labels.bad key!: \"bad key!\" is not a label key",
		"config.yaml:10:42: kubernetes.proxy_pod_labels.app: \"not a value\" is not a label value",
		"config.yaml:11:20: kubernetes.proxy_namespace: \"Ferry\" is not a namespace name",
		"config.yaml:12:16: kubernetes.proxy_cidrs: expected a non-empty list",
		"config.yaml:13:20: kubernetes.checkpoint_size: \"10 GB\" is not a storage size",
		"config.yaml:14:29: kubernetes.checkpoint_storage_class: \"EFS_SC\" is not a storage class name",
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

func TestParseFerryConfigEmptyProxyPodLabels(t *testing.T) {
	_, err := ParseFerryConfig("config.yaml", []byte("kubernetes:\n  proxy_pod_labels: {}\n"))
	if got := Errors(err); len(got) != 1 || !strings.HasPrefix(got[0].Error(), "config.yaml:2:21: kubernetes.proxy_pod_labels: expected at least one label") {
		t.Fatalf("errors %v, want one refusing the empty selector", got)
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

func TestParseFerryConfigClouds(t *testing.T) {
	cfg, err := ParseFerryConfig("config.yaml", []byte(`
aws:
  regions: [us-east-1, us-west-2]
  endpoint: http://127.0.0.1:4566
  amis: {us-east-1: ami-0123}
  proxy_cidrs: [10.0.3.0/24, 203.0.113.7/32]
  proxy_security_groups: [sg-0123456789abcdef0]
  checkpoint_nfs: fs-0123.efs.us-east-1.amazonaws.com:/
gcp:
  project: ferry-test
  proxy_cidrs: [10.128.0.5/32]
  proxy_tags: [ferry-proxy]
  checkpoint_nfs: 10.0.0.2:/ckpt
`))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(&CloudConfig{Regions: []string{"us-east-1", "us-west-2"}, Endpoint: "http://127.0.0.1:4566", AMIs: map[string]string{"us-east-1": "ami-0123"},
		ProxyCIDRs: []string{"10.0.3.0/24", "203.0.113.7/32"}, ProxySecurityGroups: []string{"sg-0123456789abcdef0"},
		CheckpointNFS: "fs-0123.efs.us-east-1.amazonaws.com:/"}, cfg.AWS); diff != "" {
		t.Errorf("aws (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(&CloudConfig{Project: "ferry-test", Regions: []string{DefaultGCPRegion}, ProxyCIDRs: []string{"10.128.0.5/32"}, ProxyTags: []string{"ferry-proxy"},
		CheckpointNFS: "10.0.0.2:/ckpt"}, cfg.GCP); diff != "" {
		t.Errorf("gcp (-want +got):\n%s", diff)
	}
	if cfg, err := ParseFerryConfig("config.yaml", []byte("aws:\n")); err != nil || cfg.AWS == nil || cfg.AWS.Regions[0] != DefaultAWSRegion {
		t.Errorf("an empty aws section: %+v, %v; want AWS enabled in %s", cfg, err, DefaultAWSRegion)
	}

	_, err = ParseFerryConfig("config.yaml", []byte(`aws:
  regions: [us-east-1, us-east-1, US_WEST]
  endpoint: ftp://x
  project: p
  proxy_cidrs: [10.0.0.0/33, 10.0.3.0/24, 10.0.3.0/24]
  proxy_security_groups: [proxies]
gcp:
  regions: []
  proxy_tags: [Proxy]
  proxy_security_groups: [sg-0123456789abcdef0]
  checkpoint_nfs: my-efs
`))
	got := Errors(err)
	want := []string{
		"config.yaml:2:24: aws.regions[1]: region \"us-east-1\" is listed twice",
		"config.yaml:2:35: aws.regions[2]:",
		"config.yaml:3:13: aws.endpoint:",
		"config.yaml:4:3: aws.project: unknown field",
		"config.yaml:5:17: aws.proxy_cidrs[0]: \"10.0.0.0/33\" is not a CIDR block",
		"config.yaml:5:43: aws.proxy_cidrs[2]: \"10.0.3.0/24\" is listed twice",
		"config.yaml:6:27: aws.proxy_security_groups[0]: \"proxies\" is not a security group id",
		"config.yaml:7:1: gcp.project: required",
		"config.yaml:8:12: gcp.regions: expected a non-empty list",
		"config.yaml:9:16: gcp.proxy_tags[0]: \"Proxy\" is not a network tag",
		"config.yaml:10:3: gcp.proxy_security_groups: unknown field",
		"config.yaml:11:19: gcp.checkpoint_nfs: \"my-efs\" is not an NFS share",
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
