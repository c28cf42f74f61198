package controller

import (
	"context"
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
		"secret workdir and mount":    {spec: tenancyBase + "workdir: secret://code\nfile_mounts:\n  /etc/creds: secret://creds\n  /etc/one.key: secret://creds/one.key\n"},
		"claim mounts":                {spec: tenancyBase + "file_mounts:\n  /models: pvc://models\n  /data/train: pvc://data/sets/train\n"},
		"claim on a cloud": {spec: strings.Replace(tenancyBase, "  infra: kubernetes\n", "  ordered:\n    - infra: kubernetes\n    - infra: aws\n", 1) + "file_mounts:\n  /models: pvc://models\n",
			wantErr: []string{"file_mounts./models: pvc://models is a PersistentVolumeClaim, which only pods of infra kubernetes mount, and this FerryService may run on aws"}},
		"claim in home":             {spec: tenancyBase + "file_mounts:\n  ~/models: pvc://models\n", wantErr: []string{"a claim is mounted at an absolute path: write /models"}},
		"claim leaving it":          {spec: tenancyBase + "file_mounts:\n  /m: pvc://models/../other\n", wantErr: []string{"must be a clean relative path that stays inside it"}},
		"claim workdir":             {spec: tenancyBase + "workdir: pvc://code\n", wantErr: []string{"workdir: pvc://code: a workdir is copied into the pod, a claim is mounted"}},
		"bad secret name":           {spec: tenancyBase + "file_mounts:\n  /k: secret://Not_A_Name/k\n", wantErr: []string{"is not a Secret name"}},
		"secret workdir of one key": {spec: tenancyBase + "workdir: secret://code/app.py\n", wantErr: []string{"a workdir is a directory: write secret://code"}},
		"other scheme":              {spec: tenancyBase + "file_mounts:\n  /k: https://example.com/x\n", wantErr: []string{"a FerryService's sources are configmap://NAME[/KEY], secret://NAME[/KEY], pvc://CLAIM[/SUBPATH] or s3://BUCKET[/PREFIX] (with bucketCredentials)"}},
		"git workdir":               {spec: tenancyBase + "workdir:\n  url: https://github.com/skypilot-org/skypilot.git\n"},
		"a cloud":                   {spec: strings.Replace(tenancyBase, "infra: kubernetes", "infra: aws/us-east-1", 1)},
		"infra local": {spec: strings.Replace(tenancyBase, "infra: kubernetes", "infra: local", 1),
			wantErr: []string{"resources.infra: local runs the replicas' commands on the controller's own host"}},
		"no infra": {spec: strings.Replace(tenancyBase, "  infra: kubernetes\n", "  cpus: 1\n", 1),
			wantErr: []string{"resources.infra: required"}},
		"infra anywhere": {spec: strings.Replace(tenancyBase, "infra: kubernetes", "infra: '*'", 1),
			wantErr: []string{"resources.infra: required"}},
		"a prefill pool on kubernetes": {spec: strings.Replace(tenancyBase, "  ports: 8080\n", "  ports: 8080\n  pools:\n    prefill:\n      resources: {infra: kubernetes}\n", 1)},
		"a prefill pool on local": {spec: strings.Replace(tenancyBase, "  ports: 8080\n", "  ports: 8080\n  pools:\n    prefill:\n      resources: {infra: local}\n", 1),
			wantErr: []string{"service.pools.prefill.resources.infra: local runs the replicas' commands on the controller's own host"}},
		"local as a fallback": {spec: strings.Replace(tenancyBase, "  infra: kubernetes\n", "  ordered:\n    - infra: kubernetes\n    - infra: local\n", 1),
			wantErr: []string{"resources alternative 2: infra: local"}},
		"local workdir": {spec: tenancyBase + "workdir: /var/run/secrets/kubernetes.io/serviceaccount\n",
			wantErr: []string{"workdir: /var/run/secrets/kubernetes.io/serviceaccount is a path on the controller's filesystem", "configmap://NAME"}},
		"relative workdir": {spec: tenancyBase + "workdir: .\n", wantErr: []string{"workdir: . is a path on the controller's filesystem"}},
		"local file mount": {spec: tenancyBase + "file_mounts:\n  /tmp/t: ~/.ferry/proxy.token\n",
			wantErr: []string{"file_mounts./tmp/t: ~/.ferry/proxy.token is a path on the controller's filesystem"}},
		"s3 source": {spec: tenancyBase + "file_mounts:\n  /data: s3://any-bucket/prefix\n",
			wantErr: []string{"file_mounts./data: s3://any-bucket/prefix would be listed and presigned with the controller's bucket credentials", "in spec.bucketCredentials", "pvc://CLAIM"}},
		"gs source": {spec: tenancyBase + "file_mounts:\n  /data: gs://any-bucket\n", wantErr: []string{"file_mounts./data: gs://any-bucket: a pod has no Google credentials"}},
		"gs source with credentials": {spec: tenancyBase + "bucketCredentials: creds\nfile_mounts:\n  /data: gs://any-bucket\n",
			wantErr: []string{"file_mounts./data: gs://any-bucket: a pod has no Google credentials"}},
		"s3 source with credentials": {spec: tenancyBase + "bucketCredentials: creds\nfile_mounts:\n  /data: s3://any-bucket/prefix\n"},
		"s3 source with credentials on a cloud": {spec: strings.Replace(tenancyBase, "  infra: kubernetes\n", "  ordered:\n    - infra: kubernetes\n    - infra: aws\n", 1) + "bucketCredentials: creds\nfile_mounts:\n  /data: s3://any-bucket/prefix\n",
			wantErr: []string{"file_mounts./data: s3://any-bucket/prefix is fetched with your credentials (bucketCredentials) by pods only, and this FerryService may run on aws, whose VMs would fetch it with the controller's"}},
		"s3 source with credentials mounted": {spec: tenancyBase + "bucketCredentials: creds\nfile_mounts:\n  /data:\n    source: s3://any-bucket/prefix\n    mode: MOUNT\n",
			wantErr: []string{"mode MOUNT would mount it with the node's: write mode: COPY"}},
		"bad credentials name": {spec: tenancyBase + "bucketCredentials: Not_A_Name\nfile_mounts:\n  /data: s3://any-bucket/prefix\n",
			wantErr: []string{"bucketCredentials: \"Not_A_Name\" is not a Secret name"}},
		"the stored spelling": {spec: tenancyBase + "bucketCredentials: creds\nfile_mounts:\n  /data: s3+secret://other/creds/any-bucket\n",
			wantErr: []string{"file_mounts./data: s3+secret://other/creds/any-bucket: a FerryService's sources are"}},
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
			_, _, err := parseFerryService(&u)
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
		"a tenant's bucket": {task: &configs.Task{Resources: kube, Service: &configs.Service{},
			FileMounts: map[string]string{"/data": "s3+secret://tenant/creds/bucket/prefix"}}},
		"a tenant's bucket on a cloud": {task: &configs.Task{Resources: configs.Resources{Infra: "aws"}, Service: &configs.Service{},
			FileMounts: map[string]string{"/data": "s3+secret://tenant/creds/bucket/prefix"}}, want: true},
		"a bucket with the controller's credentials": {task: &configs.Task{Resources: kube, Service: &configs.Service{},
			FileMounts: map[string]string{"/data": "s3://bucket/prefix"}}, want: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := fs.breaksTenancy(&service{task: tc.task}); got != tc.want {
				t.Errorf("breaksTenancy = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestPruneSnapshots: the snapshots a service's task names stay, those no task names go, and
// one being written is left to its writer.
func TestPruneSnapshots(t *testing.T) {
	root := filepath.Join(t.TempDir(), "ferryservice-files", "tenant")
	kept, err := writeSnapshot(root, map[string][]byte{"serve.py": []byte("v2")})
	if err != nil {
		t.Fatal(err)
	}
	keptFile, err := writeSnapshot(root, map[string][]byte{"app.yaml": []byte("a: 1")})
	if err != nil {
		t.Fatal(err)
	}
	stale, err := writeSnapshot(root, map[string][]byte{"serve.py": []byte("v1")})
	if err != nil {
		t.Fatal(err)
	}
	writing := filepath.Join(root, tmpSnapshotPrefix+"123")
	if err := os.Mkdir(writing, 0o700); err != nil {
		t.Fatal(err)
	}
	inUse := map[string]bool{}
	snapshotsNamed(root, &configs.Task{Workdir: kept, FileMounts: map[string]string{"/etc/app.yaml": filepath.Join(keptFile, "app.yaml"), "/x": "/elsewhere"}}, inUse)
	n, err := pruneSnapshots(root, inUse)
	if err != nil || n != 1 {
		t.Fatalf("pruned %d, %v; want 1", n, err)
	}
	for _, dir := range []string{kept, keptFile, writing} {
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("%s: %v; want it kept", dir, err)
		}
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the stale snapshot: %v; want it removed", err)
	}
	if n, err := pruneSnapshots(filepath.Join(root, "none"), nil); err != nil || n != 0 {
		t.Errorf("no root: %d, %v", n, err)
	}
}

// TestClaimInAnotherNamespace: a claim is the FerryService's namespace's, and a pod mounts
// the claims of its own: when an infra the task may run on puts its pods in another namespace,
// where a claim of the same name would be someone else's, the claim is refused, before it is
// read.
func TestClaimInAnotherNamespace(t *testing.T) {
	src := &namespaceSources{namespace: "tenant", podNamespaces: func(*configs.Task) map[string]string {
		return map[string]string{"kubernetes/a": "tenant", "kubernetes/b": "ferry-replicas"}
	}}
	task := &configs.Task{Resources: configs.Resources{Infra: "kubernetes"}, FileMounts: map[string]string{"/models": "pvc://models"}}
	_, err := resolveSources(context.Background(), src, task, "")
	var te *TenancyError
	if !errors.As(err, &te) || !strings.Contains(err.Error(), "file_mounts./models: pvc://models: ") ||
		!strings.Contains(err.Error(), "claim models is in namespace tenant, and a pod mounts the claims of its own namespace only, but kubernetes/b runs its pods in namespace ferry-replicas") {
		t.Errorf("got %v; want a TenancyError naming kubernetes/b's namespace", err)
	}
}
