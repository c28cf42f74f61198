package controller

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/ferryserve/ferry/configs"
)

// tenancyBase is a FerryService spec a tenant may apply; each case adds or replaces lines.
const tenancyBase = `resources:
  infra: kubernetes
service:
  readiness_probe: /health
  replicas: 1
  ports: 8080
run: ferry replica-sim --port $FERRY_PORT
`

// TestParseFerryServiceTenancy: what the webhook and the reconcile both run refuses each way a
// FerryService could reach the controller's host, files or credentials, with the field and
// what to write instead, and accepts the tenant's own sources.
func TestParseFerryServiceTenancy(t *testing.T) {
	tests := map[string]struct {
		spec    string
		wantErr []string // substrings of the error; none: accepted
	}{
		"kubernetes, no files":        {spec: tenancyBase},
		"configmap workdir and mount": {spec: tenancyBase + "workdir: configmap://code\nfile_mounts:\n  /etc/app: configmap://cfg\n  /etc/one.txt: configmap://cfg/one.txt\n"},
		"git workdir":                 {spec: tenancyBase + "workdir:\n  url: https://github.com/skypilot-org/skypilot.git\n"},
		"a cloud":                     {spec: strings.Replace(tenancyBase, "infra: kubernetes", "infra: aws/us-east-1", 1)},
		"infra local": {spec: strings.Replace(tenancyBase, "infra: kubernetes", "infra: local", 1),
			wantErr: []string{"resources.infra: local runs the replicas' commands on the controller's own host"}},
		"no infra": {spec: strings.Replace(tenancyBase, "  infra: kubernetes\n", "  cpus: 1\n", 1),
			wantErr: []string{"resources.infra: required"}},
		"infra anywhere": {spec: strings.Replace(tenancyBase, "infra: kubernetes", "infra: '*'", 1),
			wantErr: []string{"resources.infra: required"}},
		"local as a fallback": {spec: strings.Replace(tenancyBase, "  infra: kubernetes\n", "  ordered:\n    - infra: kubernetes\n    - infra: local\n", 1),
			wantErr: []string{"resources alternative 2: infra: local"}},
		"local workdir": {spec: tenancyBase + "workdir: /var/run/secrets/kubernetes.io/serviceaccount\n",
			wantErr: []string{"workdir: /var/run/secrets/kubernetes.io/serviceaccount is a path on the controller's filesystem", "configmap://NAME"}},
		"relative workdir": {spec: tenancyBase + "workdir: .\n", wantErr: []string{"workdir: . is a path on the controller's filesystem"}},
		"local file mount": {spec: tenancyBase + "file_mounts:\n  /tmp/t: ~/.ferry/proxy.token\n",
			wantErr: []string{"file_mounts./tmp/t: ~/.ferry/proxy.token is a path on the controller's filesystem"}},
		"s3 source": {spec: tenancyBase + "file_mounts:\n  /data: s3://any-bucket/prefix\n",
			wantErr: []string{"file_mounts./data: s3://any-bucket/prefix would be listed and presigned with the controller's bucket credentials"}},
		"gs source":          {spec: tenancyBase + "file_mounts:\n  /data: gs://any-bucket\n", wantErr: []string{"file_mounts./data: gs://any-bucket would be"}},
		"bad configmap name": {spec: tenancyBase + "workdir: configmap://Not_A_Name\n", wantErr: []string{"is not a ConfigMap name"}},
		"workdir of one key": {spec: tenancyBase + "workdir: configmap://code/app.py\n", wantErr: []string{"a workdir is a directory"}},
		"tls files": {spec: strings.Replace(tenancyBase, "  ports: 8080\n", "  ports: 8080\n  tls:\n    keyfile: /etc/ferry/tls.key\n    certfile: /etc/ferry/tls.crt\n", 1),
			wantErr: []string{"service.tls: keyfile and certfile are files on the controller's host"}},
		"pod config": {spec: tenancyBase + "config:\n  kubernetes:\n    pod_config:\n      spec:\n        serviceAccountName: ferry\n",
			wantErr: []string{"config.kubernetes: pod_config and custom_metadata"}},
		"every problem at once": {spec: strings.Replace(tenancyBase, "infra: kubernetes", "infra: local", 1) + "workdir: /\nfile_mounts:\n  /d: s3://b\n",
			wantErr: []string{"infra: local", "workdir: /", "file_mounts./d"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var u unstructured.Unstructured
			u.Object = map[string]any{"metadata": map[string]any{"name": "svc", "namespace": "tenant"}}
			var spec map[string]any
			if err := yaml.Unmarshal([]byte(tc.spec), &spec); err != nil {
				t.Fatal(err)
			}
			u.Object["spec"] = spec
			_, err := parseFerryService(&u)
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var te *TenancyError
			if !errors.As(err, &te) {
				t.Fatalf("got %v, want a TenancyError", err)
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
		})
	}
}

// TestWriteSnapshot: a ConfigMap's content lands once per content, every key a file, and the
// same content finds the same directory (a restarted controller rewrites it there).
func TestWriteSnapshot(t *testing.T) {
	root := filepath.Join(t.TempDir(), "files")
	files := map[string][]byte{"app.py": []byte("print(1)\n"), "model.bin": {0, 1, 2}}
	dir, err := writeSnapshot(root, files)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range files {
		got, err := os.ReadFile(filepath.Join(dir, k))
		if err != nil || string(got) != string(v) {
			t.Errorf("%s: %q, %v; want %q", k, got, err, v)
		}
	}
	again, err := writeSnapshot(root, files)
	if err != nil || again != dir {
		t.Errorf("same content: %s, %v; want %s", again, err, dir)
	}
	other, err := writeSnapshot(root, map[string][]byte{"app.py": []byte("print(2)\n")})
	if err != nil || other == dir {
		t.Errorf("other content: %s, %v; want a directory of its own", other, err)
	}
	if _, err := writeSnapshot(root, map[string][]byte{"../escape": nil}); err == nil {
		t.Error("a key that leaves the directory was written")
	}
}

// TestBreaksTenancy: a running service's snapshots of ConfigMaps are the tenant's sources, not
// the controller's files; a path elsewhere, or infra local, breaks the rules.
func TestBreaksTenancy(t *testing.T) {
	root := filepath.Join(t.TempDir(), "ferryservice-files", "tenant")
	fs := &ferryServices{files: root}
	kube := configs.Resources{Infra: "kubernetes"}
	tests := map[string]struct {
		task *configs.Task
		want bool
	}{
		"snapshots": {task: &configs.Task{Resources: kube, Service: &configs.Service{}, Workdir: filepath.Join(root, "abc"),
			FileMounts: map[string]string{"/etc/a": filepath.Join(root, "def", "a.yaml")}}},
		"the controller's home":   {task: &configs.Task{Resources: kube, Service: &configs.Service{}, Workdir: filepath.Dir(root)}, want: true},
		"a path beside the root":  {task: &configs.Task{Resources: kube, Service: &configs.Service{}, FileMounts: map[string]string{"/t": root + "-x/token"}}, want: true},
		"infra local":             {task: &configs.Task{Resources: configs.Resources{Infra: configs.InfraLocal}, Service: &configs.Service{}}, want: true},
		"kubernetes and no files": {task: &configs.Task{Resources: kube, Service: &configs.Service{}}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := fs.breaksTenancy(&service{task: tc.task}); got != tc.want {
				t.Errorf("breaksTenancy = %v, want %v", got, tc.want)
			}
		})
	}
}
